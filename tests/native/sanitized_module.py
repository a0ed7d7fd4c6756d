"""Run by tests/test_native.py under AddressSanitizer (LD_PRELOAD) with the module built with
-fsanitize=address,undefined: the CPython glue (Program, Channel, Lane, PairLane) through real collectives and messages,
jax_ext's XLA custom calls (xla_ffi.c; pair_native.c through a point-to-point ppermute) on two devices of
this process and on a communicator of one rank,
and the GPU lane (gpu_lane.c) against the stand-in CUDA driver (argv[2]) through tests/test_gpu_lane.py, and
jax_ext's CUDA custom calls (xla_ffi_gpu.c) with synthetic call frames (argv[3]) through tests/test_xla_ffi_gpu.py."""

import asyncio
import importlib.util
import os
import sys

spec = importlib.util.spec_from_file_location("aioccl.native._core", sys.argv[1])
assert spec is not None and spec.loader is not None
core = importlib.util.module_from_spec(spec)
sys.modules["aioccl.native._core"] = core
spec.loader.exec_module(core)

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import aioccl  # noqa: E402
from aioccl import native  # noqa: E402

sys.path.insert(0, "tests")
from test_native import _every_collective  # noqa: E402

from conftest import close_all, make_comms  # noqa: E402


async def main() -> None:
    assert native.core is core, native.status()
    for n in (1, 2, 3):
        comms = await make_comms(n)
        for dt in (np.dtype(np.int8), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float64)):
            for _ in range(3):  # the second and third calls take the fast lane
                xs = [np.full(7, c.rank + 1, dt) for c in comms]
                await asyncio.gather(*(c.all_reduce(x, op) for c, x in zip(comms, xs, strict=True)
                                       for op in ("sum",)))
                assert all((x == n * (n + 1) // 2).all() for x in xs), xs
            if n > 1:
                await _every_collective(comms, dt)
        if n == 2:  # a mismatch through the lane
            got = await asyncio.gather(*(c.all_reduce(np.ones(7 + c.rank, np.float64)) for c in comms),
                                       return_exceptions=True)
            assert all(isinstance(e, aioccl.CollectiveMismatch) for e in got), got
            a, b = comms  # point-to-point through the pair lane (pair_lane.c, core/fifo.c)
            for k, size in enumerate((0, 5, 4000, 100_000)):
                x, y = (np.arange(size) % 91).astype(np.int32), np.full(size, -1, np.int32)
                await asyncio.gather(a.isend(x, 1, k), b.irecv(y, 0, k))
                assert (y == x).all(), (size, y[:8])
            assert a._pair.native.stats()["sent"] >= 4 and b._pair.native.stats()["received"] >= 1
            # a flood past the FIFO: the send that finds it full waits for room (pair_room.c), gives up (its
            # receiver is this thread), and the rest go the general way behind it
            floods = [(np.arange(100_000) % 89 + j).astype(np.int32) for j in range(12)]
            sends = [a.isend(x, 1, 50) for x in floods]
            for x in floods:
                y = np.full(100_000, -1, np.int32)
                await b.irecv(y, 0, 50)
                assert (y == x).all(), y[:8]
            await asyncio.gather(*sends)
            assert a._pair.native.stats()["full"] >= 1, a._pair.native.stats()
        await close_all(comms)


asyncio.run(main())

if hasattr(core, "ffi_handlers"):  # jax_ext's custom calls through this module: 2 devices of one process
    os.environ["AIOCCL_JAX_MESH"] = "aioccl"  # (else one process's mesh ops are XLA's own: jax_ext/in_process.py)
    import jax
    import jax.numpy as jnp

    import jax_ext

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("i",))
    f = jax.jit(jax.shard_map(lambda v: jax.lax.fori_loop(0, 20, lambda i, a: jax_ext.pmax(a + i, "i") - i, v),
                              mesh=mesh, in_specs=jax.P("i"), out_specs=jax.P("i"), check_vma=False))
    for _ in range(3):
        got = np.asarray(f(jnp.arange(8.0)))
        assert (got == np.tile(np.arange(4.0, 8.0), 2)).all(), got
    # a point-to-point ppermute (past the gather's size, set small here) on the pair lane from XLA's threads
    # (pair_native.c)
    os.environ["AIOCCL_NATIVE_MAX_BYTES"] = "65536"
    swap = jax.jit(jax.shard_map(lambda v: jax.lax.fori_loop(0, 10, lambda i, a: jax_ext.ppermute(
        a, "i", perm=[(0, 1), (1, 0)]) + 1.0, v), mesh=mesh, in_specs=jax.P("i"), out_specs=jax.P("i"),
        check_vma=False))
    before = core.ffi_stats()["native"]
    for _ in range(3):
        got = np.asarray(swap(jnp.arange(2 * 65536, dtype=jnp.float32)))
        assert (got == np.arange(2 * 65536, dtype=np.float32) + 10).all(), got[:4]
    assert core.ffi_stats()["native"] > before, core.ffi_stats()
    one = jax.jit(lambda v: jax_ext.all_reduce(v))  # the process's communicator: one rank here
    for _ in range(3):
        assert (np.asarray(one(jnp.arange(4.0))) == np.arange(4.0)).all()
    assert core.ffi_stats()["native"] > 0, core.ffi_stats()
    jax_ext.shutdown()
if len(sys.argv) > 2:  # the GPU lane (gpu_lane.c, cuda_driver.c) against the stand-in driver built there
    from pathlib import Path

    import test_gpu_lane

    driver = test_gpu_lane.open_standin(Path(sys.argv[2]))
    assert test_gpu_lane.run_all(driver) >= 10
    if len(sys.argv) > 3 and hasattr(core, "ffi_gpu_handlers"):  # jax_ext's CUDA custom calls (xla_ffi_gpu.c)
        import ctypes

        import test_xla_ffi_gpu

        assert test_xla_ffi_gpu.run_all(driver, ctypes.CDLL(sys.argv[3])) >= 5
print("sanitized module ok", flush=True)
