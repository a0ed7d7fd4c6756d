"""Rank 2 joins an all_reduce(timeout=1) late (argv[1] seconds) in real processes (issue 45 item 2).

Every rank must reach the same outcome: all the exact sum (on time), or all the same CollectiveTimeout
naming rank 2, the late rank included (never a sum the others raised for). Either way the next
all_reduce is exact on every rank: the communicator stays usable, over sockets and shared memory.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import aioccl  # noqa: E402

from _check import Checker  # noqa: E402


async def main(delay: float) -> None:
    comm = await aioccl.init(timeout=20)
    r = comm.rank
    ck = Checker(r)
    await comm.barrier()
    if r == 2:
        await asyncio.sleep(delay)
    x = np.full(4, r + 1.0)
    t0 = time.monotonic()
    try:
        await comm.all_reduce(x, timeout=1)
        outcome = "ok"
        ck.same("the sum", x, np.full(4, 6.0))
    except aioccl.CollectiveTimeout as e:
        outcome = "timeout"
        ck.true(f"the timeout names rank 2 and seq 1: {e}", e.waiting_for == [2] and e.seq == 1)
        if r == 2:
            ck.true(f"the late rank fails at once: {time.monotonic() - t0:.2f}s", time.monotonic() - t0 < 0.5)
    print(f"[rank {r}] OUTCOME {outcome}", flush=True)
    y = np.full(4, r + 1.0)
    await comm.all_reduce(y, timeout=10)
    ck.same("the next all_reduce", y, np.full(4, 6.0))
    ck.finish(f"late_rank {delay}")
    await comm.close()


asyncio.run(main(float(sys.argv[1])))
