"""The GPU lane on a real GPU: the same calls over and over, exact every time, and taken by the lane.

    aioccl-run --nproc-per-node 2 tests/workers/gpu_lane.py [ITERS]

Each collective (all_reduce in place and into ``out``, broadcast, all_gather, reduce_scatter, scatter,
all_to_all in place, reduce, gather, scan) is called ITERS times on the same buffers with new exact data
each time, read back and checked in full; then the same from a second stream and a second thread.
Prints ``LANE_OK rank=<r> checks=<n> ran=<ops the lane did>/<ops>``, then the host time of an 8-byte
all_reduce (``LANE_HOST``: per call back to back, one call on an idle GPU, inside the call), whether the
lane is on or not (AIOCCL_NATIVE=0: the Python path, for A/B).
``scripts/gpu-check.sh`` runs it with ``GPU_LANE_EXPECT=1``: then at least half the calls must have been
run by the lane.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import cupy as cp
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import aioccl  # noqa: E402

from _check import Checker  # noqa: E402


def lane_ran(comm: aioccl.Communicator) -> int:
    lane = comm._gpu_lane.native
    return int(lane.ran) if lane is not None else 0


def rounds(comm: aioccl.Communicator, chk: Checker, iters: int, tag: str) -> int:
    """Every op ``iters`` times on the same buffers; how many calls were made."""
    n, r = comm.world_size, comm.rank
    count = 1000 + 3  # not a multiple of 16 bytes' elements: the units and the one-by-one tail
    x = cp.empty(count, np.float32)
    out = cp.empty(count, np.float32)
    gat = cp.empty(n * count, np.float32)
    big = cp.empty(n * count, np.float32)
    blk = cp.empty(count, np.float32)
    base = np.arange(count, dtype=np.float32) % 97
    calls = 0
    for it in range(iters):
        mine = base + r + it
        x.set(mine)
        comm.all_reduce(x).wait()
        want = sum(base + k + it for k in range(n))
        chk.same(f"{tag} all_reduce in place #{it}", cp.asnumpy(x), want.astype(np.float32))
        x.set(mine)
        out.set(np.full(count, -1, np.float32))
        comm.all_reduce(x, "max", out=out).wait()
        chk.same(f"{tag} all_reduce max out #{it}", cp.asnumpy(out), (base + n - 1 + it).astype(np.float32))
        x.set(mine)
        comm.broadcast(x, root=n - 1).wait()
        chk.same(f"{tag} broadcast #{it}", cp.asnumpy(x), (base + n - 1 + it).astype(np.float32))
        x.set(mine)
        gat.set(np.full(n * count, -1, np.float32))
        comm.all_gather(x, out=gat).wait()
        chk.same(f"{tag} all_gather #{it}", cp.asnumpy(gat),
                 np.concatenate([base + k + it for k in range(n)]).astype(np.float32))
        big.set(np.concatenate([base + r * 10 + j + it for j in range(n)]).astype(np.float32))
        blk.set(np.full(count, -1, np.float32))
        comm.reduce_scatter(big, out=blk).wait()
        chk.same(f"{tag} reduce_scatter #{it}", cp.asnumpy(blk),
                 sum(base + k * 10 + r + it for k in range(n)).astype(np.float32))
        blk.set(np.full(count, -1, np.float32))
        comm.scatter(big, root=0, out=blk).wait()  # root 0's block r: base + r + it
        chk.same(f"{tag} scatter #{it}", cp.asnumpy(blk), (base + r + it).astype(np.float32))
        comm.all_to_all(big).wait()  # in place: block j of rank k is base + k * 10 + j + it
        chk.same(f"{tag} all_to_all in place #{it}", cp.asnumpy(big),
                 np.concatenate([base + k * 10 + r + it for k in range(n)]).astype(np.float32))
        x.set(mine)
        got = comm.reduce(x, root=0).wait()  # into root's x; None elsewhere, x untouched
        chk.same(f"{tag} reduce #{it}", cp.asnumpy(x), (want if r == 0 else mine).astype(np.float32))
        chk.true(f"{tag} reduce gives x on the root, None elsewhere #{it}", got is (x if r == 0 else None))
        x.set(mine)
        gat.set(np.full(n * count, -1, np.float32))
        got = comm.gather(x, root=n - 1, out=gat if r == n - 1 else None).wait()
        if r == n - 1:
            chk.same(f"{tag} gather #{it}", cp.asnumpy(gat),
                     np.concatenate([base + k + it for k in range(n)]).astype(np.float32))
        else:
            chk.true(f"{tag} gather gives None off the root #{it}", got is None)
        x.set(mine)
        comm.scan(x).wait()
        chk.same(f"{tag} scan #{it}", cp.asnumpy(x), sum(base + k + it for k in range(r + 1)).astype(np.float32))
        calls += 10
    return calls


def host_time(comm: aioccl.Communicator) -> tuple[float, float, float]:
    """Host microseconds per in-place 8-byte all_reduce (max: repeated in place, it stays finite): (400 calls
    enqueued back to back, per call; one call with the GPU idle; inside the call, as the flight recorder
    timed it), medians of 5 sets and of 300 single calls."""
    x = cp.asarray(np.ones(2, np.float32))
    s = cp.cuda.get_current_stream()
    for _ in range(50):
        comm.all_reduce(x, "max")
    s.synchronize()
    sets = []
    for _ in range(5):
        comm.barrier().wait()
        t0 = time.perf_counter()
        for _ in range(400):
            comm.all_reduce(x, "max")
        sets.append((time.perf_counter() - t0) / 400 * 1e6)
        s.synchronize()
    single = []
    comm.barrier().wait()
    for _ in range(300):
        s.synchronize()
        t0 = time.perf_counter()
        comm.all_reduce(x, "max")
        single.append((time.perf_counter() - t0) * 1e6)
    s.synchronize()
    inside = [took * 1e6 for op, _, _, exc, took in list(comm._state.recorder.entries)[-200:] if op == "all_reduce"]
    return float(np.median(sets)), float(np.median(single)), float(np.median(inside))


def main() -> None:
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    comm = aioccl.init_sync(timeout=60)
    chk = Checker(comm.rank)
    calls = rounds(comm, chk, iters, "default stream")
    with cp.cuda.Stream(non_blocking=True):
        calls += rounds(comm, chk, 3, "another stream")
    errors: list[BaseException] = []
    made: list[int] = []

    def other() -> None:
        try:
            with cp.cuda.Device(0):
                made.append(rounds(comm, chk, 3, "another thread"))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    if errors:
        raise errors[0]
    calls += made[0]
    if os.environ.get("GPU_LANE_EXPECT") == "1":  # scripts/gpu-check.sh: a real GPU, the native core built
        chk.true(f"the GPU lane ran ops (it ran {lane_ran(comm)} of {calls})", lane_ran(comm) >= calls // 2)
    chk.finish(f"rank {comm.rank} lane")
    path = comm._launcher.gpu.path if comm._launcher.gpu is not None else "?"
    print(f"LANE_OK rank={comm.rank} checks={chk.count} ran={lane_ran(comm)}/{calls} path={path}", flush=True)
    back_to_back, single, inside = host_time(comm)
    print(f"LANE_HOST rank={comm.rank} back to back {back_to_back:.1f} us/op, one call on an idle GPU {single:.1f} "
          f"us, inside the call {inside:.1f} us; native={'on' if comm._gpu_lane.native else 'off'}", flush=True)
    comm.close()


if __name__ == "__main__":
    main()
