"""Every op on GPU buffers, every dtype, exact data, poisoned outputs: the GPU path end to end.

    aioccl-run --nproc-per-node 3 gpu_ops.py [COUNT ...]

``GPU_OPS_STREAM=1``: every op on a non-blocking stream of its own (inputs written on it, ``stream=`` it).

Ranks share the machine's GPU(s) as separate processes (CUDA IPC allows it).
With the real cupy this is the GPU test that ``scripts/gpu-check.sh`` runs;
``tests/test_gpu.py`` runs it with ``tests/fakecupy`` on machines without a
GPU, which checks the orchestration (tickets, staging, the IPC exchange,
plans) but not CUDA. Prints ``GPU_OK rank=<r> checks=<n> path=<ipc|staged>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys

import cupy as cp
import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import aioccl  # noqa: E402

from _check import DTYPES, Checker, data, ops_for, poison, reduced  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)


class Bf16OnGpu:
    """A bfloat16 GPU buffer as JAX and torch present one (cupy itself has no bfloat16)."""

    dtype = BF16

    def __init__(self, storage: cp.ndarray) -> None:
        self.storage = storage

    @property
    def __cuda_array_interface__(self) -> dict:
        return self.storage.__cuda_array_interface__


def dev(a: np.ndarray):
    a = np.ascontiguousarray(a)
    if a.dtype == BF16:
        return Bf16OnGpu(cp.asarray(a.view(np.uint16)))
    return cp.asarray(a)


def host(x, dt) -> np.ndarray:
    if isinstance(x, Bf16OnGpu):
        return cp.asnumpy(x.storage).view(BF16)
    return cp.asnumpy(x).view(dt)


async def done(w: aioccl.Work):
    """Await ``w``, then order the default stream (where ``host()`` reads) after its results."""
    res = await w
    if w.event is not None:
        cp.cuda.get_current_stream().wait_event(w.event)
    return res


async def run_dtype(comm: aioccl.Communicator, chk: Checker, dt: type, count: int, stream=None) -> None:
    """Every op on ``dt`` x ``count``. With ``stream``: inputs written on it, every op given ``stream=`` it,
    results read on the default stream after it waited for ``work.event`` (as with NCCL, an awaited op's
    results are ordered on its stream; the event orders them for others)."""
    r, n = comm.rank, comm.world_size
    tag = f"{np.dtype(dt).name} x{count}" + (" stream=" if stream is not None else "")
    on = stream if stream is not None else contextlib.nullcontext()
    kw = {"stream": stream} if stream is not None else {}

    def make(a: np.ndarray):
        with on:
            return dev(a)

    for op in ops_for(dt):
        out = make(poison(count, dt))
        w = comm.all_reduce(make(data(r, count, dt, op)), op, out=out, **kw)
        await done(w)
        assert w.event is not None, "a finished GPU op carries its CUDA event"
        chk.same(f"all_reduce {op} {tag}", host(out, dt), reduced(n, count, dt, op))
    root = n - 1
    out = make(poison(count, dt))
    await done(comm.reduce(make(data(r, count, dt)), root, "sum", out=out, **kw))
    chk.same(f"reduce {tag}", host(out, dt), reduced(n, count, dt, "sum") if r == root else poison(count, dt))
    x = make(data(0, count, dt) if r == 0 else poison(count, dt))
    await done(comm.broadcast(x, 0, **kw))
    chk.same(f"broadcast {tag}", host(x, dt), data(0, count, dt))
    out = make(poison(n * count, dt))
    await done(comm.all_gather(make(data(r, count, dt)), out=out, **kw))
    chk.same(f"all_gather {tag}", host(out, dt), np.concatenate([data(i, count, dt) for i in range(n)]))
    groot = 1 % n
    out = make(poison(n * count, dt))
    await done(comm.gather(make(data(r, count, dt)), groot, out=out if r == groot else None, **kw))
    if r == groot:
        chk.same(f"gather {tag}", host(out, dt), np.concatenate([data(i, count, dt) for i in range(n)]))
    out = make(poison(count, dt))
    await done(comm.reduce_scatter(make(data(r, n * count, dt)), "sum", out=out, **kw))
    chk.same(f"reduce_scatter {tag}", host(out, dt), reduced(n, n * count, dt, "sum")[r * count:(r + 1) * count])
    out = make(poison(count, dt))
    await done(comm.scatter(make(data(0, n * count, dt)) if r == 0 else None, 0, out=out, **kw))
    chk.same(f"scatter {tag}", host(out, dt), data(0, n * count, dt)[r * count:(r + 1) * count])
    out = make(poison(n * count, dt))
    await done(comm.all_to_all(make(data(r, n * count, dt)), out=out, **kw))
    chk.same(f"all_to_all {tag}", host(out, dt),
             np.concatenate([data(i, n * count, dt)[r * count:(r + 1) * count] for i in range(n)]))
    out = make(poison(count, dt))
    await done(comm.scan(make(data(r, count, dt)), "sum", out=out, **kw))
    chk.same(f"scan {tag}", host(out, dt), reduced(r + 1, count, dt, "sum"))
    if n > 1:
        out = make(poison(count, dt))
        s = comm.isend(make(data(r, count, dt)), (r + 1) % n, tag=7, **kw)
        await done(comm.irecv(out, (r - 1) % n, tag=7, **kw))
        await s
        chk.same(f"send/recv {tag}", host(out, dt), data((r - 1) % n, count, dt))
        out = make(poison(count, dt))  # from any source, with any tag: the staged receive's status comes through
        s = comm.isend(make(data(r, count, dt)), (r + 1) % n, tag=8, **kw)
        w = comm.irecv(out, aioccl.ANY_SOURCE, aioccl.ANY_TAG, **kw)
        await done(w)
        await s
        chk.same(f"recv from any source {tag}", host(out, dt), data((r - 1) % n, count, dt))
        chk.true(f"recv from any source {tag}: status {w.status}", w.status == aioccl.Status((r - 1) % n, 8))


async def in_flight(comm: aioccl.Communicator, chk: Checker) -> None:
    """Twelve ops issued before any is awaited, on two streams: each op's staging blocks and scratch are
    reused only once the GPU is done with them, and results land in order of each stream."""
    r, n = comm.rank, comm.world_size
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    pending = []
    for k in range(12):
        dt, count, s = DTYPES[k % len(DTYPES)], 60 + k, streams[k % 2]
        with s:
            x, out = dev(data(r, count, dt)), dev(poison(count, dt))
        pending.append((comm.all_reduce(x, out=out, stream=s), out, dt, count))
    for k, (w, out, dt, count) in enumerate(pending):
        await done(w)
        chk.same(f"in flight #{k} all_reduce {np.dtype(dt).name} x{count}", host(out, dt),
                 reduced(n, count, dt, "sum"))


async def extras(comm: aioccl.Communicator, chk: Checker) -> None:
    r, n = comm.rank, comm.world_size
    x = cp.asarray(data(r, 10, np.float32))
    got = await comm.all_reduce(x)  # in place: the same cupy array comes back
    assert got is x
    chk.same("all_reduce in place", cp.asnumpy(x), reduced(n, 10, np.float32, "sum"))
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:  # the op reads its input in stream= order, as NCCL does: the input is written on that stream
        y = cp.asarray(data(r, 10, np.int32))
    await done(comm.all_reduce(y, "max", stream=stream))  # the default stream waits for work.event
    chk.same("all_reduce on stream=", cp.asnumpy(y), reduced(n, 10, np.int32, "max"))
    await in_flight(comm, chk)
    fresh = await comm.all_gather(cp.asarray(data(r, 4, np.int64)))
    assert isinstance(fresh, cp.ndarray)
    chk.same("all_gather into a new cupy array", cp.asnumpy(fresh), np.concatenate([data(i, 4, np.int64)
                                                                                       for i in range(n)]))
    for bad, why in ((lambda: comm.all_reduce(cp.zeros(4, np.float32), out=np.zeros(4, np.float32)),
                      "different devices"),
                     (lambda: comm.all_reduce(np.zeros(4, np.float32), stream=stream), "stream= orders"),
                     (lambda: comm.all_reduce(cp.zeros(4, np.int32), "avg"), "avg")):
        try:
            bad()
        except aioccl.InvalidArgument as e:
            assert why in str(e), e
            chk.count += 1
        else:
            raise AssertionError(f"accepted a call that should fail with {why!r}")
    z = cp.asarray(data(r, 3, np.float64))
    await comm.all_reduce(z)  # still usable after the refusals
    chk.same("usable after refusals", cp.asnumpy(z), reduced(n, 3, np.float64, "sum"))
    await mismatch(comm, chk)


async def mismatch(comm: aioccl.Communicator, chk: Checker) -> None:
    """Rank r reduces 10 + r elements: a different call on every rank, caught on every rank. The staged path
    raises it from the op and stays usable; the CUDA-IPC path finds it on the device, so the op itself is
    done at enqueue and the communicator's next GPU op raises it (as will every later one: its GPU ops are
    failed, as NCCL's communicator is after an asynchronous error)."""
    r, n = comm.rank, comm.world_size
    device = comm._launcher.gpu.path.startswith("ipc")
    try:
        await comm.all_reduce(cp.asarray(data(r, 10 + r, np.int32)))
        if device:
            cp.cuda.Device().synchronize()  # the kernel has run: the error word is set
            await comm.all_reduce(cp.asarray(data(r, 5, np.int64)))
    except aioccl.CollectiveMismatch as e:
        assert "mismatch" in str(e), e
        chk.count += 1
        print(f"GPU_MISMATCH rank={r}: {e}", flush=True)
    else:
        raise AssertionError("an all_reduce of different counts on every rank was not caught")
    w = cp.asarray(data(r, 5, np.int64))
    if device:
        try:
            await comm.all_reduce(w)
        except aioccl.CollectiveMismatch:
            chk.count += 1
        else:
            raise AssertionError("a failed device path accepted another op")
        return
    await comm.all_reduce(w)  # and usable after it
    chk.same("usable after a mismatch", cp.asnumpy(w), reduced(n, 5, np.int64, "sum"))


async def main() -> None:
    counts = [int(c) for c in sys.argv[1:]] or [1, 7, 1500]
    comm = await aioccl.init(timeout=120)
    chk = Checker(comm.rank)
    stream = cp.cuda.Stream(non_blocking=True) if os.environ.get("GPU_OPS_STREAM") == "1" else None
    for count in counts:
        for dt in DTYPES:
            await run_dtype(comm, chk, dt, count, stream)
    await extras(comm, chk)
    path = comm._launcher.gpu.path if comm._launcher.gpu is not None else "none"
    await comm.close()
    chk.finish(f"rank {comm.rank} GPU ops")
    print(f"GPU_OK rank={comm.rank} checks={chk.count} path={path}", flush=True)


asyncio.run(main())
