"""Every use of JAX internals in jax_ext, in one place.

jax_ext needs things JAX has no public API for: an *ordered* effect (so XLA
runs our collectives in program order on every device, whatever their data
dependencies), a lowering to our own FFI targets or to the buffer-callback
one with the tokens threaded through (zero-copy host buffers, in order), the varying-manual-axes
("vma") type of values inside ``shard_map``, the concrete mesh at lowering
time and the ``jax.distributed`` key-value store. These move between JAX
releases, so they live here, behind a pinned range: a new JAX means
re-checking this file (and running ``tests/test_jax_ext*.py``), nothing else.
"""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jaxlib.version import __version__ as _jaxlib_version

# tested: 0.10.2 (the newest for Python 3.11), 0.11.2 (GPU machines, Python 3.12), 0.12.0.1 (Python 3.12/3.13)
JAX_RANGE = ((0, 10, 0), (0, 13, 0))


def _version(v: str) -> tuple[int, int, int]:
    """The leading (major, minor, micro) of a version string: each component's leading digits only, so
    "0.4.61+cuda110" and "0.4.61a1" are (0, 4, 61), "0.12.0.1" is (0, 12, 0) and "0.5.dev" is (0, 5, 0)."""
    parts = [re.match(r"\d*", p).group() for p in re.split(r"[.+]", v)[:3]]  # type: ignore[union-attr]
    nums = [int(p) if p else 0 for p in parts] + [0, 0, 0]
    return nums[0], nums[1], nums[2]


def check_version(version: str) -> None:
    """Refuse a jax older than ``JAX_RANGE`` (jax_ext uses internals it lacks); warn, as mpi4jax does, about
    one newer than tested: it may work, and the user decides (``AIOCCL_JAX_NO_VERSION_WARNING=1`` silences it)."""
    found, (low, high) = _version(version), JAX_RANGE
    text = ".".join
    if found < low:
        raise ImportError(f"jax_ext needs jax >= {text(map(str, low))}; found jax {version}")
    if found >= high and os.environ.get("AIOCCL_JAX_NO_VERSION_WARNING", "").strip() not in ("1", "true", "yes"):
        warnings.warn(f"jax_ext is tested with jax < {text(map(str, high))}, but you have {version}: it uses JAX "
                      "internals (jax_ext/_compat.py) that may have moved; set AIOCCL_JAX_NO_VERSION_WARNING=1 to "
                      "silence this", UserWarning, stacklevel=3)


check_version(jax.__version__)

from jax._src import config as _config  # noqa: E402
from jax._src import core as _core  # noqa: E402
from jax._src import dispatch as _dispatch  # noqa: E402
from jax._src import effects as _effects  # noqa: E402
from jax._src import ffi as _ffi  # noqa: E402
from jax._src.interpreters import ad as _ad  # noqa: E402
from jax._src.interpreters import batching as _batching  # noqa: E402
from jax._src.interpreters import mlir as _mlir  # noqa: E402

Primitive = _core.Primitive
ShapedArray = _core.ShapedArray
Zero = _ad.Zero  # type: ignore[attr-defined]


def instantiate_zeros(t: Any) -> Any:
    return _ad.instantiate_zeros(t)  # type: ignore[no-untyped-call]




class CollectiveEffect(_effects.Effect):
    """aioccl collectives: ordered (program order on each device), allowed in shard_map, loops, remat."""

    def __str__(self) -> str:
        return "aioccl"


class MeshCollectiveEffect(CollectiveEffect):
    """The second ordered effect of mesh-level ops, so that a ``shard_map`` body always takes two tokens.

    Why: JAX passes one token per ordered effect into the manual computation
    that ``shard_map`` lowers to. When the body takes no arrays (all its inputs
    unused, or none), that call's only operand is a single token, and XLA's
    NullaryFunctionWrapInliner (jax >= 0.11) inlines it with a control
    dependence from the token on every instruction of the body. The algebraic
    simplifier cannot replace instructions that carry control dependences, so
    it loops ("circular simplification loop ... main.*_spmd") and, in some
    programs (an all_to_all beside ``lax.all_to_all``), XLA then crashes.
    JAX's own ordered ``io_callback`` does the same. Two tokens are not "a
    single token operand", so the body is inlined by the ordinary call inliner.
    """

    def __str__(self) -> str:
        return "aioccl-mesh"


EFFECT = CollectiveEffect()
MESH_EFFECT = MeshCollectiveEffect()
for _set in (_effects.lowerable_effects, _effects.ordered_effects, _effects.shardable_ordered_effects,
             _effects.control_flow_allowed_effects, _effects.custom_derivatives_allowed_effects,
             _effects.remat_allowed_effects):
    _set.add_type(CollectiveEffect)
    _set.add_type(MeshCollectiveEffect)

PROCESS_EFFECTS = (EFFECT,)
MESH_EFFECTS = (EFFECT, MESH_EFFECT)


def _keep_placed_tokens() -> None:
    """Hand a jitted call our effects' runtime tokens as they are when they already sit on its devices.

    Why: JAX's ``RuntimeTokenSet.get_token_input`` builds a ``Mesh`` and a
    ``NamedSharding`` and ``device_put`` s the previous call's output token on
    every call, even when it is already where it must be: about 90 us of
    Python per ordered effect per call, more than an 8-byte all_reduce over
    shared memory. Only our effects take this path, and only when the token's
    devices are the call's, in its order, one shard each; else JAX's own code
    runs (it reshards).

    Like JAX's own path (``array._token_shard_arg``), it first waits for the
    previous call's token. If that call failed, its token carries the error,
    and JAX would raise it again for every later call on those devices (seen
    on a GPU, where a failed callback's execution completes asynchronously):
    the failure belongs to that op alone, so the token is replaced by a fresh one.
    """
    cls = type(_dispatch.runtime_tokens)
    original = getattr(cls, "get_token_input", None)
    if original is None or getattr(original, "_aioccl", False):
        return

    def get_token_input(self: Any, eff: Any, devices: list[Any]) -> Any:
        tok = self.current_tokens.get(eff) if isinstance(eff, CollectiveEffect) else None
        buf = getattr(tok, "_buf", None)
        if isinstance(tok, _core.Token) and buf is not None:
            try:
                buf.block_until_ready()
            except Exception:  # noqa: BLE001 - the previous op's failure, already raised to its caller
                del self.current_tokens[eff]
                return original(self, eff, devices)  # no token yet: JAX makes a fresh one
            placed = tuple(getattr(buf.sharding, "_device_assignment", ()))
            if placed == tuple(devices) and len(buf.addressable_shards) == len(placed):
                return tok
        return original(self, eff, devices)

    get_token_input._aioccl = True  # type: ignore[attr-defined]
    cls.get_token_input = get_token_input  # type: ignore[method-assign]


_keep_placed_tokens()

_TARGETS = {"cpu": "xla_buffer_python_cpu_callback", "cuda": "xla_buffer_python_gpu_callback",
            "rocm": "xla_buffer_python_gpu_callback"}

# A host callback receives (execution context, token in, *inputs, token out, *outputs).
HostCallback = Callable[[Any, Sequence[Any], Sequence[Any]], None]


def new_primitive(name: str, multiple_results: bool = False) -> Any:
    p = Primitive(name)
    p.multiple_results = multiple_results
    _dispatch.simple_impl(p)  # type: ignore[no-untyped-call] # outside jit: compile the one op (eager calls work like lax's)
    return p


EffectsOf = Callable[..., tuple[Any, ...]]  # effects(**params): the op's ordered effects, in token order


def new_local_primitive(name: str, fn: Callable[..., Any]) -> Any:
    """A primitive with no effect and no communication, ``fn`` (JAX code on its operands and params) wherever
    it runs: eager, traced and lowered. Its output has its first operand's shape and dtype."""
    p = Primitive(name)
    p.def_impl(fn)  # type: ignore[no-untyped-call]
    p.def_abstract_eval(lambda x, *_, **__: x)  # type: ignore[no-untyped-call]
    _mlir.register_lowering(p, _mlir.lower_fun(fn, multiple_results=False))
    return p


def def_abstract_eval(p: Any, rule: Callable[..., Any], effects: EffectsOf) -> None:
    """``rule(*avals, **params) -> aval(s)``; ``effects(**params)`` (``PROCESS_EFFECTS`` or ``MESH_EFFECTS``)."""
    p.def_effectful_abstract_eval(lambda *a, **k: (rule(*a, **k), set(effects(**k))))


def def_jvp(p: Any, rule: Callable[..., Any]) -> None:
    _ad.primitive_jvps[p] = rule


def def_transpose(p: Any, rule: Callable[..., Any]) -> None:
    _ad.primitive_transposes[p] = rule


def def_batching(p: Any, rule: Callable[..., Any]) -> None:
    _batching.primitive_batchers[p] = rule


# make_site(lowering_info, avals_in, avals_out, **params): the native custom call's site, or None
SiteMaker = Callable[..., "int | None"]
# first(lowering_info, aval of the first operand, **params): None, or (f, rest): ``f`` (JAX code, no effects)
# runs on the first operand before the op, which then runs with the parameters ``rest`` (None: f is the whole op)
FirstPart = Callable[..., "tuple[Callable[[Any], Any], dict[str, Any] | None] | None"]


def def_lowering(p: Any, make_callback: Callable[..., HostCallback], aliases: Callable[..., dict[int, int]],
                 effects: EffectsOf, make_site: SiteMaker | None = None, first: FirstPart | None = None) -> None:
    """Lower ``p`` to its native FFI target ``p.name`` (when ``make_site`` gives a site: jax_ext/native_call.py)
    or else to the buffer-callback FFI target, threading the tokens of its ordered ``effects``.

    ``make_callback(lowering_info, **params)`` builds the host function once
    per compiled module; ``aliases(**params)`` maps input -> output indices
    that share memory (XLA copies first where the input is still live, and
    not at all when it was donated). A native custom call holds no host
    callback, so its module can go to JAX's persistent compilation cache.
    """

    def lowering(ctx: Any, *operands: Any, **params: Any) -> Sequence[Any]:
        platforms = ctx.module_context.platforms
        if len(platforms) != 1 or platforms[0] not in _TARGETS:
            raise NotImplementedError(f"aioccl collectives lower on cpu or cuda only, not {platforms}")
        info = LoweringInfo(platforms[0], ctx.module_context.axis_context)
        parts = first(info, ctx.avals_in[0], **params) if first is not None else None
        if parts is not None:  # XLA's part first (jax_ext/in_process.py), then ours on what it made, if any
            f, rest = parts
            x_ctx = dataclasses.replace(ctx, avals_in=ctx.avals_in[:1], avals_out=ctx.avals_out[:1])
            (x,) = _mlir.lower_fun(f, multiple_results=False)(x_ctx, operands[0])
            if rest is None:
                ctx.set_tokens_out(ctx.tokens_in)
                return [x]
            operands, params = (x, *operands[1:]), rest
        effs = effects(**params)
        n_tok, n_in = len(effs), len(operands)
        tokens = [ctx.tokens_in.get(e) for e in effs]
        token_avals = [_core.abstract_token] * n_tok
        tctx = dataclasses.replace(ctx, avals_in=[*token_avals, *ctx.avals_in],
                                   avals_out=[*token_avals, *ctx.avals_out])
        shifted = {i + n_tok: o + n_tok for i, o in aliases(**params).items()}
        site = make_site(info, ctx.avals_in, ctx.avals_out, **params) if make_site is not None else None
        if site is not None and _SERIALIZING_CRASHES and module_devices(info.axis_context) > 1:
            _keep_out_of_persistent_cache(ctx.module_context)
        if site is not None:
            rule = _ffi.build_ffi_lowering_function(p.name, has_side_effect=True, operand_output_aliases=shifted)
            results = rule(tctx, *tokens, *operands, site=np.int64(site)).results
            ctx.set_tokens_out(_mlir.TokenSet(dict(zip(effs, results[:n_tok], strict=True))))
            return list(results[n_tok:])
        callback = make_callback(info, **params)

        def host(exec_ctx: Any, *bufs: Any) -> tuple[()]:
            # the buffers: n_tok tokens, the inputs, n_tok tokens, the outputs
            callback(exec_ctx, bufs[n_tok:n_tok + n_in], bufs[2 * n_tok + n_in:])
            return ()

        ctx.module_context.add_host_callback(host)
        index = np.uint64(len(ctx.module_context.host_callbacks) - 1)
        rule = _ffi.build_ffi_lowering_function(_TARGETS[platforms[0]], has_side_effect=True,
                                                operand_output_aliases=shifted)
        results = rule(tctx, *tokens, *operands, index=index).results
        ctx.set_tokens_out(_mlir.TokenSet(dict(zip(effs, results[:n_tok], strict=True))))
        return list(results[n_tok:])

    _mlir.register_lowering(p, lowering, cacheable=False)  # each module holds its own host callback


# jaxlib 0.10 segfaults writing the persistent-cache entry of a program that runs these custom calls on more than
# one device of a process (inside xla::Layout::ToProto, serializing the executable's token layouts); jax.lax's own
# collectives and one-device programs are written fine, and jaxlib 0.11.2 and 0.12.0.1 write and read all of them
_SERIALIZING_CRASHES = _version(_jaxlib_version) < (0, 11, 0)


def module_devices(axis_context: Any) -> int:
    """How many devices the module being lowered runs on: its ``shard_map`` mesh's, else the partitioner's."""
    mesh = getattr(axis_context, "mesh", None)
    if mesh is not None and getattr(mesh, "size", None) is not None:
        return int(mesh.size)
    return partitioned_devices(axis_context)


def _never_called(*_: Any) -> None:
    raise AssertionError("jax_ext's persistent-cache marker is a host callback that XLA never calls")


def _keep_out_of_persistent_cache(module_context: Any) -> None:
    """JAX writes no persistent-cache entry for a module that holds a host callback (its callbacks are baked into
    the program); one that is never called marks the module so (``_SERIALIZING_CRASHES``). It costs the module a
    cache entry only: the program, its dispatch and its tokens are those of any module with ordered effects."""
    if _never_called not in module_context.host_callbacks:
        module_context.add_host_callback(_never_called)


@dataclasses.dataclass(frozen=True)
class LoweringInfo:
    platform: str
    axis_context: Any

    def concrete_mesh(self) -> Any | None:
        """The device mesh ``shard_map`` runs on, where JAX knows it at lowering (a concrete ``Mesh``)."""
        mesh = getattr(self.axis_context, "mesh", None)
        if mesh is None or not hasattr(mesh, "devices"):
            try:
                ctx_mesh = jax.sharding.get_mesh()
            except Exception:  # noqa: BLE001 - no context mesh set
                return None
            return ctx_mesh if getattr(ctx_mesh, "devices", None) is not None and ctx_mesh.devices.size else None
        return mesh


def partitioned_devices(axis_context: Any) -> int:
    """How many devices XLA's partitioner splits a jitted computation over (1 when it does not; a shard_map
    body's ops are per device: 1)."""
    from jax._src import sharding_impls

    if isinstance(axis_context, sharding_impls.ShardingContext):
        return int(axis_context.num_devices)
    return 1


def callback_stream(exec_ctx: Any) -> int:
    """The CUDA stream XLA runs the callback's computation on (``ExecutionContext.stream``, jaxlib 0.7+)."""
    stream = getattr(exec_ctx, "stream", None)
    if stream is None:
        raise NotImplementedError("this jaxlib's buffer callback exposes no CUDA stream (ctx.stream)")
    return int(stream)


# -- shard_map / axis environment ---------------------------------------------------------------------
def abstract_mesh() -> Any:
    return jax.sharding.get_abstract_mesh()


def manual_mesh_axes() -> tuple[tuple[Any, ...], dict[Any, int]]:
    """The (names, sizes) of the current abstract mesh's *manual* axes (those shard_map made per-device)."""
    mesh = abstract_mesh()
    names = tuple(getattr(mesh, "axis_names", ()) or ())
    if not names:
        return (), {}
    types = getattr(mesh, "axis_types", ())
    manual = tuple(n for n, t in zip(names, types, strict=False) if str(t).endswith("Manual"))
    return manual, {n: int(s) for n, s in zip(names, mesh.axis_sizes, strict=True)}


def ppermute_axes(axes: tuple[Any, ...]) -> tuple[Any, ...]:
    """The axis order ``lax.ppermute`` numbers a multi-axis group in, so that ours numbers it the same way.

    Up to jax 0.11 lax sorts the axes into mesh order, whatever the order given.
    From 0.12 it refuses an order other than the mesh's (``RuntimeError``)
    unless ``jax_raise_on_ppermute_sort_diff`` is off, and then keeps the order given.
    """
    names = tuple(getattr(abstract_mesh(), "axis_names", ()) or ())
    in_mesh_order = tuple(sorted(axes, key=lambda a: names.index(a) if a in names else -1))
    flag = getattr(_config, "raise_on_ppermute_sort_diff", None)
    if flag is None:
        return in_mesh_order
    if in_mesh_order != axes and flag.value:
        raise RuntimeError(f"ppermute: axis_name {axes} is not in the mesh's order {names}; jax.lax.ppermute "
                           "refuses it too. Pass the axes in mesh order, or set "
                           "jax.config.update('jax_raise_on_ppermute_sort_diff', False) to number the group in "
                           "the order given")
    return axes


def check_vma() -> bool:
    return bool(_config._check_vma.value)


def varying(aval: Any) -> frozenset[Any]:
    mat = getattr(aval, "mat", None)
    return frozenset(mat.varying) if mat is not None else frozenset()


def with_varying(aval: Any, names: frozenset[Any]) -> Any:
    if not check_vma() or getattr(aval, "mat", None) is None:
        return aval
    return aval.update(manual_axis_type=aval.mat.update(varying=frozenset(names)))


def pvary(x: Any, axes: tuple[Any, ...]) -> Any:
    """Mark ``x`` device-varying along ``axes`` (a no-op on the data), as lax's collectives do first."""
    if not check_vma() or not axes:
        return x
    missing = tuple(a for a in axes if a not in varying(_core.typeof(x)))
    return _core.pvary(x, missing) if missing else x  # type: ignore[no-untyped-call]


# -- jax.distributed ----------------------------------------------------------------------------------
def distributed_client() -> tuple[Any, int, int] | None:
    """(key-value client, process id, process count) when ``jax.distributed.initialize`` ran, else None."""
    from jax._src import distributed

    state = distributed.global_state
    if state.client is None or state.num_processes <= 1:
        return None
    return state.client, int(state.process_id), int(state.num_processes)


def effects_barrier() -> None:
    jax.effects_barrier()  # type: ignore[no-untyped-call]


def def_linearize(p: Any, rule: Callable[..., Any]) -> None:
    """The rule ``jax.linearize`` / ``jax.grad`` use instead of jvp + partial evaluation."""
    _ad.primitive_linearizations[p] = rule
