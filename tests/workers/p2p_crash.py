"""A pipeline of point-to-point stages loses stage 1 to SIGKILL (issue 45 item 3).

Rank 0 sends a stream of messages to rank 1, each rank i > 0 receives from i - 1 and passes on to i + 1.
Ranks 3 and up exchange messages only with live neighbours, yet every survivor must learn of the loss
at once (PeerLost naming rank 1, not a deadline), then all survivors shrink to a communicator of exactly
the n - 1 live ranks (the last one calls shrink a second late), on which an all_reduce is exact.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import aioccl  # noqa: E402

from _check import Checker  # noqa: E402

KILL_AT = 30


async def main() -> None:
    comm = await aioccl.init(timeout=30)
    n, r = comm.world_size, comm.rank
    ck = Checker(r)
    await comm.barrier()
    buf = np.zeros(4, np.int64)
    last = time.monotonic()
    try:
        for k in range(1_000_000):
            if r == 1 and k == KILL_AT:
                os.kill(os.getpid(), signal.SIGKILL)
            if r > 0:
                await comm.irecv(buf, r - 1, tag=k % 1000, timeout=60)
                ck.true(f"message {k} in order", int(buf[0]) == k)
            else:
                buf[:] = k
            if r < n - 1:
                await comm.isend(buf, r + 1, tag=k % 1000, timeout=60)
            last = time.monotonic()
            await asyncio.sleep(0.002 if r == 0 else 0)
        ck.true("the pipeline ended by itself", False)
    except aioccl.PeerLost as e:
        took = time.monotonic() - last
        ck.true(f"PeerLost names rank 1: {e}", e.rank == 1)
        ck.true(f"learnt at once, not at a deadline: {took:.2f}s", took < 3.0)
        print(f"[rank {r}] lost rank {e.rank} after {took:.3f}s: {e}", flush=True)
    for w in (comm.isend(buf, (r + 1) % n), comm.all_reduce(np.ones(2))):
        ck.true(f"a new op fails at once: {w!r}", w.done())
        try:
            await w
            ck.true("a new op on the communicator fails", False)
        except aioccl.PeerLost as e:
            ck.true("a new op raises the same PeerLost", e.rank == 1)
    if r == n - 1:
        await asyncio.sleep(1.0)  # a survivor that comes to shrink late is waited for, never dropped
    t0 = time.monotonic()
    new = await comm.shrink(timeout=20)
    took = time.monotonic() - t0
    ck.true(f"shrunk to the {n - 1} live ranks in {took:.2f}s: {new.world_size}", new.world_size == n - 1)
    x = np.full(8, r + 1, np.int64)
    await new.all_reduce(x)
    ck.same("all_reduce on the shrunk communicator", x, np.full(8, sum(q + 1 for q in range(n) if q != 1), np.int64))
    ck.finish(f"p2p_crash n={n}")
    await new.close()


asyncio.run(main())
