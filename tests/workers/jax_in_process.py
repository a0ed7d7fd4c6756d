"""Where jax_ext's mesh-level ops run: XLA's collectives in a process, aioccl's across (jax_ext/in_process.py).

Run as a script: one process with 4 CPU devices, or, with ``JAXW_COORD``/``JAXW_NPROC``/``JAXW_PID`` set, one
of 2 processes with 2 devices each joined by ``jax.distributed`` (mesh axis "x" across the processes, "y"
inside each). For each op, counts in its lowered program the aioccl custom calls (native or host callback)
and XLA's own collectives, checks them against what ``AIOCCL_JAX_MESH`` says, and compares the result with
``jax.lax``'s on every device, bit for bit. Prints ``PLACED OK <checks>`` or the first difference.
"""

from __future__ import annotations

import itertools
import os
import re
import sys

MULTI = bool(os.environ.get("JAXW_COORD"))
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={2 if MULTI else 4}"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

if MULTI:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(os.environ["JAXW_COORD"], int(os.environ["JAXW_NPROC"]), int(os.environ["JAXW_PID"]))

import jax_ext  # noqa: E402

lax = jax.lax
ALL = ("x", "y")
mesh = Mesh(np.array(jax.devices()).reshape(2, -1), ALL)
MODE = os.environ.get("AIOCCL_JAX_MESH", "auto")
SIZES = (8, 40960)  # float32 per device: 32 B, and 160 KiB (past auto's 128 KiB: XLA's)
OURS = re.compile(r"custom_call @(aioccl_\w+|xla_buffer_python_cpu_callback)")
THEIRS = re.compile(r'"stablehlo\.(all_reduce|all_gather|reduce_scatter|all_to_all|collective_permute)"'
                    r"|stablehlo\.(all_reduce|all_gather|reduce_scatter|all_to_all|collective_permute)\b")
checks = 0


def data(n: int) -> jax.Array:
    idx = lax.axis_index(ALL)
    return ((jnp.arange(n, dtype=jnp.int32) * 3 + idx * 7) % 23 - 11).astype(jnp.float32)


def check(label: str, n: int, ours, ref, want_ours: int, want_theirs: int) -> None:
    """``ours()`` and ``ref()`` build one op on the same data; ``want_*``: the calls of each kind it lowers to
    (-1: any number, at least one)."""
    global checks

    def body(_):
        v = data(n)
        return jnp.expand_dims(ours(v), 0), jnp.expand_dims(ref(v), 0)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(ALL), out_specs=P(ALL), check_vma=False))
    x = jnp.zeros(len(jax.devices()))
    text = f.lower(x).as_text()
    ref_text = jax.jit(jax.shard_map(lambda _: jnp.expand_dims(ref(data(n)), 0), mesh=mesh, in_specs=P(ALL),
                                     out_specs=P(ALL), check_vma=False)).lower(x).as_text()
    n_ours = len(OURS.findall(text))
    n_theirs = len(THEIRS.findall(text)) - len(THEIRS.findall(ref_text))  # the reference's own taken away
    for what, n, want in (("aioccl calls", n_ours, want_ours), ("XLA collectives", n_theirs, want_theirs)):
        if (n < 1) if want < 0 else (n != want):
            print(f"PLACED FAIL {label}: {n} {what}, expected {'some' if want < 0 else want}", flush=True)
            sys.exit(1)
    a, b = f(x)
    for sa, sb in zip(a.addressable_shards, b.addressable_shards, strict=True):
        if not np.array_equal(np.asarray(sa.data), np.asarray(sb.data)):
            print(f"PLACED FAIL {label} on {sa.device}: {np.asarray(sa.data)} != {np.asarray(sb.data)}", flush=True)
            sys.exit(1)
        checks += 1


def xla_takes(n: int) -> bool:
    """Whether XLA runs an op of ``n`` float32 per device among one process's devices, as the module's
    docstring says it does (auto: from 128 KiB, or at every size where aioccl has no native custom call, as
    with AIOCCL_NATIVE=0)."""
    from jax_ext import native_call

    return MODE == "xla" or (MODE == "auto" and (4 * n >= 128 << 10 or native_call.why_not() is not None))


def main() -> None:
    reductions = (("psum", jax_ext.psum, lax.psum), ("pmax", jax_ext.pmax, lax.pmax),
                  ("pmin", jax_ext.pmin, lax.pmin), ("pmean", jax_ext.pmean, lax.pmean))
    for (name, ours, ref), n, axes in itertools.product(reductions, SIZES, ("x", "y", ALL)):
        if not xla_takes(n):
            want = (-1, 0)
        elif not MULTI or axes == "y":
            want = (0, 1)  # lax's alone
        elif axes == "x":
            want = (-1, 0)  # across the processes: aioccl's alone
        else:
            want = (-1, 1)  # hierarchical: lax's over "y", then aioccl's over "x"
        check(f"{name} {axes} {n}", n, lambda v, o=ours, a=axes: o(v, a), lambda v, r=ref, a=axes: r(v, a), *want)
    others = (
        ("all_gather", lambda v, a: jax_ext.all_gather(v, a, tiled=True),
         lambda v, a: lax.all_gather(v, a, tiled=True)),
        ("psum_scatter", lambda v, a: jax_ext.psum_scatter(v, a, tiled=True),
         lambda v, a: lax.psum_scatter(v, a, tiled=True)),
        ("all_to_all", lambda v, a: jax_ext.all_to_all(v, a, 0, 0, tiled=True),
         lambda v, a: lax.all_to_all(v, a, 0, 0, tiled=True)),
        ("ppermute", lambda v, a: jax_ext.ppermute(v, a, [(0, 1), (1, 0)]),
         lambda v, a: lax.ppermute(v, a, [(0, 1), (1, 0)])),
        ("broadcast", lambda v, a: jax_ext.broadcast(v, 1, a), lambda v, a: lax.all_gather(v, a)[1]),
    )
    for (name, ours, ref), n, axes in itertools.product(others, SIZES, ("x", "y")):
        want = (0, -1) if xla_takes(n) and not MULTI else (-1, 0)  # across processes: aioccl's, whole
        check(f"{name} {axes} {n}", n, lambda v, o=ours, a=axes: o(v, a), lambda v, r=ref, a=axes: r(v, a), *want)
    print(f"PLACED OK {checks}", flush=True)


main()
