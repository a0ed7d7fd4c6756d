"""A pipeline of stages, one per rank, with non-blocking point-to-point transfers.

Rank 0 produces micro-batches; every rank receives a micro-batch from the
previous rank, computes, and sends it on, while the *next* receive is already
posted and earlier sends are still draining. The last rank checks every
result.

    aioccl-run --nproc-per-node 4 examples/p2p_pipeline.py [--micro-batches 64] [--size 65536]
"""

import argparse
import asyncio
import time
from typing import Any

import numpy as np

import aioccl


def stage(x: np.ndarray, rank: int) -> np.ndarray:
    """Each stage's "layer": exact integer arithmetic so the last rank can check."""
    np.multiply(x, 2, out=x)
    np.add(x, rank, out=x)
    return x


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--micro-batches", type=int, default=64)
    p.add_argument("--size", type=int, default=65536, help="float64 elements per micro-batch")
    args = p.parse_args()
    comm = await aioccl.init()
    r, n, m = comm.rank, comm.world_size, args.micro_batches
    prev, nxt = r - 1, r + 1
    slots = [np.empty(args.size) for _ in range(4)]  # a few buffers in rotation, allocated once
    sends: list[aioccl.Work[Any] | None] = [None] * len(slots)
    await comm.barrier()
    t0 = time.perf_counter()
    pending = comm.irecv(slots[0], prev, tag=0) if r > 0 else None
    for i in range(m):
        k = i % len(slots)
        previous = sends[k]
        if previous is not None:
            await previous  # the buffer we are about to reuse has left
        if r == 0:
            x = slots[k]
            x[...] = np.arange(args.size) % 1000 + i
        else:
            assert pending is not None  # every rank but 0 posted its first receive before the loop
            x = await pending
            if i + 1 < m:  # post the next receive before computing on this one
                nk = (i + 1) % len(slots)
                draining = sends[nk]
                if draining is not None:
                    await draining
                    sends[nk] = None
                pending = comm.irecv(slots[nk], prev, tag=i + 1)
        stage(x, r)
        if nxt < n:
            sends[k] = comm.isend(x, nxt, tag=i)
        else:
            want = np.arange(args.size) % 1000 + i
            for s in range(n):
                want = want * 2 + s
            assert np.array_equal(x, want), f"micro-batch {i} is wrong"
    for w in sends:
        if w is not None:
            await w
    await comm.barrier()
    dt = time.perf_counter() - t0
    if r == n - 1:
        mb = m * args.size * 8 / 1e6
        print(f"{m} micro-batches of {args.size * 8 / 1e6:.2f} MB through {n} stages in {dt * 1e3:.1f} ms "
              f"({mb / dt:.0f} MB/s per link); all results checked")
    await comm.close()


asyncio.run(main())
