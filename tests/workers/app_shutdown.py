"""Closing a communicator while a receive is still posted, as a pipeline's receiver task always is.

argv[1]: ``close`` (await close() with the receive posted), ``async_with`` (leave ``async with comm``),
``cancelled`` (the receiver task is cancelled first). Both ranks post a receive no one will match. Rank 0
closes: close must return at once and the receive raise OpCancelled naming it. Rank 1's receive from it
must then fail at once with PeerLost saying rank 0 closed, and its own close return at once too. Nothing
may be reported at exit (the test reads stderr).
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


async def main(case: str) -> None:
    comm = await aioccl.init(timeout=20)
    ck = Checker(comm.rank)
    peer = 1 - comm.rank
    buf = np.full(4, -1.0)
    w = comm.irecv(buf, peer, tag=5)
    task = asyncio.create_task(_awaited(w))
    await comm.barrier()
    if comm.rank == 1:
        t0 = time.monotonic()
        await asyncio.wait([task], timeout=5)
        took = time.monotonic() - t0
        e = task.exception() if task.done() else None
        ck.true(f"rank 0 closing fails the receive from it at once: {e!r} after {took:.2f}s",
                isinstance(e, aioccl.PeerLost) and "closed its communicator" in str(e) and took < 2.0)
    elif case == "cancelled":
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    t0 = time.monotonic()
    if case == "async_with":
        async with comm:
            pass
    else:
        await comm.close()
    took = time.monotonic() - t0
    ck.true(f"close returned in {took:.2f}s", took < 2.0)
    if comm.rank == 1:
        ck.finish(f"app_shutdown {case}")
        return
    ck.true(f"the receive is withdrawn: {w!r}", w.cancelled())
    try:
        await w
        ck.true("awaiting the closed receive raised", False)
    except aioccl.OpCancelled as e:
        why = "by close()" if case != "cancelled" else "when the task awaiting it was cancelled"
        ck.true(f"OpCancelled names the op and why: {e}", f"recv(peer={peer}, tag=5)" in str(e) and why in str(e))
    ck.same("the buffer is untouched", buf, np.full(4, -1.0))
    if case != "cancelled":
        ck.true("the receiver task saw OpCancelled", isinstance(task.exception(), aioccl.OpCancelled))
    ck.finish(f"app_shutdown {case}")


async def _awaited(w: aioccl.Work) -> None:
    await w


asyncio.run(main(sys.argv[1]))
