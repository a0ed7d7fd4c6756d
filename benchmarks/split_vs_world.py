"""A child communicator against the world it came from: all_reduce time, in one run of 4 ranks.

    .venv/bin/aioccl-run --nproc-per-node 4 --no-prefix benchmarks/split_vs_world.py

Measures, back to back in each rank, the world, ``split(0, key=-rank)`` (the same ranks, renumbered)
and the 2-rank halves of ``split(rank % 2)``; for each, the median of 3 loops of back-to-back in-place
float32 all_reduces. Rank 0 prints one line per size with the children's time over the world's.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import numpy as np

import aioccl

SIZES = ((8, 300), (1 << 20, 30))  # bytes, iterations per loop


async def loop_time(c: aioccl.Communicator, nbytes: int, iters: int) -> float:
    x = np.zeros(nbytes // 4, np.float32)
    for _ in range(3):
        await c.all_reduce(x)
    await c.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        await c.all_reduce(x)
    return (time.perf_counter() - t0) / iters


async def main() -> None:
    comm = await aioccl.init(timeout=60)
    same = await comm.split(0, key=-comm.rank)
    half = await comm.split(comm.rank % 2)
    assert same is not None and half is not None
    lines = []
    for nbytes, iters in SIZES:
        med = []
        for c in (comm, same, half):
            med.append(statistics.median([await loop_time(c, nbytes, iters) for _ in range(3)]))
        mw, ms, mh = med
        lines.append(f"{nbytes} B: world {mw * 1e6:.0f} us ({comm.transport}), split(0, key=-rank) {ms * 1e6:.0f} us "
                     f"({ms / mw:.1f}x, {same.transport}), half of split(rank % 2) {mh * 1e6:.0f} us "
                     f"({mh / mw:.1f}x, {half.transport})")
    if comm.rank == 0:
        print("\n".join(lines), flush=True)
    await comm.close()


asyncio.run(main())
