"""What every jax_ext primitive shares: groups, the mesh-position operand, the host callback.

Each primitive takes its arrays plus one int32 scalar, the device's flat
position in the ``shard_map`` mesh (``lax.axis_index`` over all mesh axes;
0 for process-level ops). XLA gives the host callback no device identity,
so this operand is how a callback running for device 3 finds device 3's
communicator. ``group`` (a static parameter) says which communicators:
``CommGroup`` (process-level, a fixed communicator) or
``AxisGroup`` (mesh axes, resolved when the program is lowered, on the
concrete mesh).

Every collective works on axis 0 (aioccl's own convention); the public
wrappers move axes around in JAX, where XLA does it and autodiff sees it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from aioccl import Communicator, ReduceOp, lowlevel
from aioccl.dtypes import check_op_dtype, dtype_code

from . import _compat, call_log, native_call, runtime
from .interrupts import run_guarded

# the communicator a callback runs on, given a way to read its device's mesh position (a device-to-host
# read on a GPU: only a mesh-level group calls it)
Resolver = Callable[[Callable[[], int]], Communicator]
RunFn = Callable[..., None]  # run(comm, ins, outs, same, **params): do the op on numpy views
STATS = {"calls": 0, "in_place": 0}  # host callbacks run, and those whose output aliased the input


def counts() -> dict[str, int]:
    """Ops run (host callbacks and native custom calls alike), and those whose output aliased the input."""
    native = native_call.stats()
    return {"calls": STATS["calls"] + sum(native.get(k, 0) for k in ("native", "carried", "python")),
            "in_place": STATS["in_place"] + native.get("in_place", 0)}


@dataclass(frozen=True)
class CommGroup:
    """A process-level op on a fixed communicator (one rank per process)."""

    comm: Communicator = field(hash=False, compare=False)
    ident: int = 0
    api: str = field(default="jax_ext", hash=False, compare=False)  # the op's public name, for errors

    @property
    def size(self) -> int:
        return self.comm.world_size

    @property
    def rank(self) -> int:
        return self.comm.rank

    def resolver(self, info: _compat.LoweringInfo) -> Resolver:
        devices = _compat.partitioned_devices(info.axis_context)
        if devices > 1:
            raise ValueError(f"{self.api}: a process-level op (comm=) in a computation partitioned over {devices} "
                             "devices: it runs once per process, on this process's one device, and XLA's "
                             "partitioner cannot place it. For an array sharded over several devices, run the op per "
                             "device inside jax.shard_map with axis_name=...; or jax.device_put the array to one "
                             "device")
        comm = self.comm
        return lambda _position: comm  # one communicator: the position is never read


@dataclass(frozen=True)
class AxisGroup:
    """A mesh-level op over ``axes`` (in that order) of the enclosing ``shard_map``."""

    axes: tuple[Any, ...]
    size: int
    api: str

    def resolver(self, info: _compat.LoweringInfo) -> Resolver:
        mesh = info.concrete_mesh()
        if mesh is None:
            raise ValueError(f"{self.api}: jax_ext needs the concrete device mesh at lowering: pass a "
                             "jax.sharding.Mesh (not an AbstractMesh) to shard_map, or set one with jax.set_mesh")
        table = runtime.mesh_group(mesh, self.axes)

        def resolve(position: Callable[[], int]) -> Communicator:
            pos = position()
            comm = table.get(pos)
            if comm is None:
                raise RuntimeError(f"{self.api}: mesh position {pos} is not a device of this process")
            return comm

        resolve.table = table  # type: ignore[attr-defined] # (native_call.py: a site's members)
        resolve.members = int(np.asarray(mesh.devices).size)  # type: ignore[attr-defined]
        return resolve


Group = CommGroup | AxisGroup


def comm_group(comm: Communicator, api: str = "jax_ext") -> CommGroup:
    return CommGroup(comm, id(comm), api)


def group_for(api: str, axis_name: Any, comm: Communicator | None) -> tuple[Group, Any]:
    """The group an op runs over and its mesh-position operand; raises for misuse, at trace time."""
    manual, sizes = _compat.manual_mesh_axes()
    if axis_name is None:
        if any(sizes[a] > 1 for a in manual):
            raise ValueError(f"{api}: inside shard_map (mesh axes {manual}) pass axis_name=...; process-level "
                             "ops (comm=) run once per process, not once per device")
        if comm is not None and not isinstance(comm, Communicator):
            raise TypeError(f"{api}: comm must be an aioccl.Communicator, got {type(comm).__name__}")
        comm = comm if comm is not None else runtime.default_comm()
        if lowlevel.on_engine_loop(comm):
            raise RuntimeError(f"{api}: called on the engine thread of {comm!r}; the host callback would block "
                               "the loop that must run the op. Create the communicator with engine='thread' "
                               "(or call the jitted function from another thread)")
        return comm_group(comm, api), np.int32(0)
    if comm is not None:
        raise ValueError(f"{api}: pass axis_name (mesh-level, inside shard_map) or comm (process-level), not both")
    axes, mesh_names = mesh_axes(api, axis_name)
    pos = jax.lax.axis_index(mesh_names).astype(jnp.int32)
    return AxisGroup(axes, math.prod(sizes[a] for a in axes), api), pos


def mesh_axes(api: str, axis_name: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The axes of a mesh-level op (``axis_name`` given) and the mesh's axis names; raises for misuse."""
    manual, _ = _compat.manual_mesh_axes()
    axes = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    if not manual:
        raise NameError(f"{api}: axis name {axes[0]!r} is not bound: mesh-level ops run inside jax.shard_map "
                        "(outside it, omit axis_name for the process-level op)")
    for a in axes:
        if a not in manual:
            raise NameError(f"{api}: unknown axis name {a!r}; the shard_map mesh axes here are {manual}")
    if len(set(axes)) != len(axes):
        raise ValueError(f"{api}: axis names repeat in {axes}")
    mesh_names = tuple(_compat.abstract_mesh().axis_names)
    if set(mesh_names) - set(manual):
        raise ValueError(f"{api}: jax_ext needs every mesh axis manual in shard_map; {mesh_names} has "
                         f"auto axes {sorted(set(mesh_names) - set(manual))}")
    return axes, mesh_names


def check_int(api: str, name: str, value: Any) -> int:
    """``value`` as an int, if it is one (bools, floats and traced values are refused, not truncated)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{api}: {name} must be an int, got {type(value).__name__} {value!r}")
    return int(value)


def check_root(api: str, root: Any, n: int) -> int:
    if not 0 <= check_int(api, "root", root) < n:
        raise ValueError(f"{api}: root {root} out of range for {n} members")
    return int(root)


def as_array(x: Any) -> Any:
    """``x`` as a JAX array: Python and numpy scalars too (mpi4jax takes them everywhere)."""
    return x if isinstance(x, jax.Array) or hasattr(x, "aval") else jnp.asarray(x)


def process_group(api: str, comm: Communicator | None) -> tuple[CommGroup, Any]:
    """The group of a process-level-only op (its output shape differs by rank, which no mesh allows)."""
    group, pos = group_for(api, None, comm)
    assert isinstance(group, CommGroup)
    return group, pos


def check_dtype(api: str, dtype: Any) -> None:
    try:
        dtype_code(np.dtype(dtype))
    except Exception as e:  # noqa: BLE001 - re-raised with the API's name
        raise TypeError(f"{api}: {e}") from None


def parse_op(op: Any) -> str:
    """The reduction's name ("sum", ...) from a string or an ``aioccl.ReduceOp``; TypeError for others."""
    try:
        return ReduceOp.parse(op).value
    except Exception as e:  # noqa: BLE001 - re-raised as the TypeError a wrong argument type is
        raise TypeError(f"jax_ext: op must be a reduction name or aioccl.ReduceOp, got {op!r}: {e}") from None


def check_reduction(api: str, op: str, dtype: Any) -> None:
    """The dtype and the op/dtype pair, as aioccl checks them, raised as TypeError at trace time."""
    check_dtype(api, dtype)
    try:
        check_op_dtype(ReduceOp.parse(op), np.dtype(dtype))
    except ValueError as e:
        raise TypeError(f"{api}: {e}") from None


def def_reduction_jvp(p: Any, api: str) -> None:
    """Reductions are linear for sum and avg only; the tangent takes the same collective."""

    def jvp(primals: Sequence[Any], tangents: Sequence[Any], *, op: str, **params: Any) -> tuple[Any, Any]:
        if op not in ("sum", "avg"):
            raise NotImplementedError(f"jax_ext: {api} with op {op!r} has no derivative (only sum and avg; "
                                      "jax.lax.pmax/pmin have none either)")
        x, pos = primals
        return (p.bind(x, pos, op=op, **params),
                p.bind(_compat.instantiate_zeros(tangents[0]), pos, op=op, **params))

    _compat.def_jvp(p, jvp)


def varying_in(group: Group, x: Any) -> Any:
    """lax's collectives first make their input device-varying along the group's axes; so do we."""
    return _compat.pvary(x, group.axes) if isinstance(group, AxisGroup) else x


# -- lowering ------------------------------------------------------------------------------------------
def callback_factory(name: str, run: RunFn) -> Callable[..., _compat.HostCallback]:
    """Build ``make_callback`` for ``_compat.def_lowering()`` from a ``run`` on array views
    (numpy on CPU; on GPU cupy views, with XLA's stream current: see ``_gpu.py``)."""

    def make(info: _compat.LoweringInfo, *, group: Group, **params: Any) -> _compat.HostCallback:
        resolve = group.resolver(info)
        on_gpu = info.platform != "cpu"
        what = f"{name}({params['op']})" if "op" in params else name

        def call(comm: Communicator, arrays: list[Any], out_arrays: list[Any], same: bool) -> None:
            if lowlevel.on_engine_thread(comm):
                raise RuntimeError(f"{comm!r}: a jax_ext collective ran on its communicator's engine thread, "
                                   "where waiting would deadlock; create it with engine='thread'")
            STATS["calls"] += 1
            STATS["in_place"] += same
            if not call_log.get_logging():  # the 8-byte op's hot path: nothing more
                run_guarded(run, comm, arrays, out_arrays, same, **params)
                return
            items = math.prod(arrays[0].shape) if arrays else 0
            with call_log.logged(comm.rank, what, items, "GPU" if on_gpu else ""):
                run_guarded(run, comm, arrays, out_arrays, same, **params)

        def host(exec_ctx: Any, ins: Sequence[Any], outs: Sequence[Any]) -> None:
            if on_gpu:
                from . import _gpu

                with _gpu.on_stream(_compat.callback_stream(exec_ctx)) as (cp, stream):
                    *bufs, pos = ins
                    comm = resolve(lambda: _gpu.read_scalar(cp, stream, pos))
                    arrays = [_gpu.view(cp, b) for b in bufs]
                    out_arrays = [_gpu.view(cp, b) for b in outs]
                    same = bool(arrays and out_arrays and int(np.prod(out_arrays[0].shape))
                                and _gpu.address(arrays[0]) == _gpu.address(out_arrays[0]))
                    call(comm, arrays, out_arrays, same)
                return
            arrays = [np.asarray(b) for b in ins[:-1]]
            out_arrays = [np.asarray(b) for b in outs]
            same = bool(arrays and out_arrays and out_arrays[0].size
                        and arrays[0].__array_interface__["data"][0] == out_arrays[0].__array_interface__["data"][0])
            call(resolve(lambda: int(np.asarray(ins[-1]))), arrays, out_arrays, same)

        return host

    return make


def define(name: str, *, abstract: Callable[..., Any], run: RunFn,
           alias: bool | Callable[..., bool] = False, multiple_results: bool = False,
           replayable: Callable[..., bool] = lambda **_: True, pair: native_call.Pair | None = None,
           first: _compat.FirstPart | None = None) -> Any:
    """A new ordered primitive ``aioccl_<name>`` whose last operand is the mesh position. ``alias``
    (or ``alias(**params)``): the output may share the first input's buffer (same shape and dtype).
    ``replayable(rank=, same=, **params)``: ``run`` is exactly one op of the communicator on the buffers
    it is given (nothing copied around it), so a native custom call may run that op alone (native_call.py).
    ``pair(rank=, **params)``: a point-to-point op's ``(dest, source, tag)`` (-1: no such half; None: not
    one the native lane runs), for the native custom call's point-to-point lane (native_call.py).
    ``first(info, aval, **params)``: XLA's part of the op, lowered before it (``_compat.FirstPart``, in_process.py)."""
    p = _compat.new_primitive(f"aioccl_{name}", multiple_results)
    _compat.def_abstract_eval(p, abstract, effects_of)
    def aliases(**params: Any) -> dict[int, int]:
        return {0: 0} if (alias(**params) if callable(alias) else alias) else {}

    _compat.def_lowering(p, callback_factory(name, run), aliases, effects_of,
                         native_call.site_maker(name, run, replayable, pair), first)
    return p


def effects_of(*, group: Group, **_: Any) -> tuple[Any, ...]:
    """Mesh-level ops carry a second ordered effect (why: ``_compat.MeshCollectiveEffect``)."""
    return _compat.MESH_EFFECTS if isinstance(group, AxisGroup) else _compat.PROCESS_EFFECTS


# -- autodiff and vmap helpers ----------------------------------------------------------------------------
def dense(ct: Any) -> Any:
    """A symbolic zero cotangent as real zeros: every rank must still run the transposed collective."""
    if type(ct) is _compat.Zero:
        aval: Any = ct.aval
        return jnp.zeros(aval.shape, aval.dtype)
    return ct


def def_linear(p: Any, transpose: Callable[..., Any]) -> None:
    """``p`` is linear in its array operand: the tangent goes through ``p`` too; ``transpose(ct, **params)``."""

    def jvp(primals: Sequence[Any], tangents: Sequence[Any], **params: Any) -> tuple[Any, Any]:
        x, pos = primals
        out = p.bind(x, pos, **params)
        t = _compat.instantiate_zeros(tangents[0])  # every rank must run the same collectives
        return out, p.bind(t, pos, **params)

    def trans(ct: Any, x: Any, pos: Any, **params: Any) -> tuple[Any, None]:
        return transpose(dense(ct), pos, **params), None

    _compat.def_jvp(p, jvp)
    _compat.def_transpose(p, trans)


def def_batching(p: Any, axis0: bool) -> None:
    """vmap: elementwise ops take the batch axis anywhere; axis-0 ops get it moved to axis 1."""

    def batch(args: Sequence[Any], dims: Sequence[Any], **params: Any) -> tuple[Any, Any]:
        *arrays, pos = args
        *adims, pdim = dims
        if pdim is not None:
            raise ValueError(f"{p.name}: cannot vmap over the mesh position (vmap inside shard_map instead)")
        (x,), (d,) = arrays, adims
        if axis0 and d != 1:
            x, d = jnp.moveaxis(x, d, 1), 1
        return p.bind(x, pos, **params), _out_dims(p, d)

    _compat.def_batching(p, batch)


def _out_dims(p: Any, d: int) -> Any:
    return [] if p.multiple_results else d
