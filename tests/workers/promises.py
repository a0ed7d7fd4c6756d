"""Failures that must reach every rank at once, in real processes: ``promises.py SCENARIO``.

Each rank prints ``RESULT <rank> <exception type> <detail> <seconds>`` for the op that failed, where
the seconds count from issuing it; the test reads those lines.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import signal
import sys
import time

import numpy as np

import aioccl

SCENARIO = sys.argv[1]


def report(rank: int, exc: BaseException, t0: float) -> None:
    detail = getattr(exc, "rank", None)
    if isinstance(exc, aioccl.CollectiveTimeout):
        detail = ",".join(map(str, exc.waiting_for))
    print(f"RESULT {rank} {type(exc).__name__} {detail} {time.monotonic() - t0:.3f} :: {str(exc).splitlines()[0]}",
          flush=True)


async def killed_rank(comm: aioccl.Communicator) -> None:
    """Rank 2 dies in the middle; ranks 0 and 1 are in a large all_reduce (1 waits on 0, not on 2)."""
    await comm.barrier()
    if comm.rank == 2:
        await asyncio.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    x = np.ones(1 << 22, np.float32)
    t0 = time.monotonic()
    try:
        await comm.all_reduce(x, timeout=120)
    except aioccl.AiocclError as e:
        report(comm.rank, e, t0)
    new = await comm.shrink(timeout=30)
    y = np.full(10, new.rank + 1, np.int32)
    await new.all_reduce(y)
    print(f"SHRUNK {comm.rank} -> {new.rank}/{new.world_size} sum {int(y[0])}", flush=True)
    await new.close()


async def different_roots(comm: aioccl.Communicator) -> None:
    """reduce with root = own rank: nobody sends, so no data frame can show the mismatch."""
    x = np.ones(1000, np.int32)
    t0 = time.monotonic()
    try:
        await comm.reduce(x, root=comm.rank, timeout=120)
        print(f"RESULT {comm.rank} none", flush=True)
    except aioccl.AiocclError as e:
        report(comm.rank, e, t0)
    await comm.barrier()  # usable afterwards
    await comm.close()


async def mismatch_async_with(comm: aioccl.Communicator) -> None:
    """A mismatch inside ``async with comm`` (which aborts on the way out) is a mismatch everywhere."""
    t0 = time.monotonic()
    try:
        async with comm:
            await comm.all_reduce(np.ones(100 + (comm.rank == 1), np.float32), timeout=120)
    except aioccl.AiocclError as e:
        report(comm.rank, e, t0)


async def one_rank_times_out(comm: aioccl.Communicator) -> None:
    """Rank 2 is late; rank 0 gives up after 1 s; rank 1 (deadline 120 s) must hear it at once."""
    x = np.ones(1000, np.float32)
    if comm.rank == 2:
        await asyncio.sleep(3)
    t0 = time.monotonic()
    try:
        await comm.all_reduce(x, timeout=1 if comm.rank == 0 else 120)
        print(f"RESULT {comm.rank} none", flush=True)
    except aioccl.AiocclError as e:
        report(comm.rank, e, t0)
    comm.abort()


async def group_and_direct(comm: aioccl.Communicator) -> None:
    """An op issued inside a group by one task and a direct op by another, same order everywhere."""
    a = np.full(1000, comm.rank + 1, np.int64)
    b = np.full(3000, -1, np.int64) if comm.rank else np.arange(3000, dtype=np.int64)
    issued = asyncio.Event()

    async def grouped() -> None:
        async with comm.group():
            comm.all_reduce(a)
            issued.set()
            await asyncio.sleep(0.3)  # the group launches at its exit, after the direct op below

    async def direct() -> None:
        await issued.wait()
        await comm.broadcast(b, root=0)

    await asyncio.gather(grouped(), direct())
    ok = bool((a == sum(range(1, comm.world_size + 1))).all() and (b == np.arange(3000)).all())
    print(f"GROUP {comm.rank} {'ok' if ok else 'WRONG'} transport={comm.transport}", flush=True)
    await comm.close()


async def both_receive_first(comm: aioccl.Communicator) -> None:
    """A deadlock: both ranks receive first. The watchdog (AIOCCL_WATCHDOG_S) names it long before the end."""
    buf = np.zeros(10)
    t0 = time.monotonic()
    try:
        await comm.irecv(buf, 1 - comm.rank, tag=9, timeout=2.5)
    except aioccl.AiocclError as e:
        report(comm.rank, e, t0)
    await comm.close()


async def forgotten_await(comm: aioccl.Communicator) -> None:
    """``comm.all_reduce(x)`` without ``await``, then the program ends: finished, or reported; never silent.

    Whether the op is still running at exit is a race (the loop's shutdown may let it end), so the rank
    says at exit, before aioccl's own exit report runs (atexit is last in, first out), which it was.
    """
    await comm.barrier()
    x = np.ones(4 << 20, np.float32)
    rank = comm.rank
    atexit.register(lambda: print(f"AT EXIT {rank} {'complete' if (x == 2).all() else 'partial'}", flush=True))
    comm.all_reduce(x)


async def closed_after_its_part(comm: aioccl.Communicator) -> None:
    """Rank 1 finishes its part of a broadcast and closes; rank 2 starts the same broadcast later and
    must still complete it: a peer that closed had finished its part, so it dooms nothing."""
    await comm.barrier()
    b = np.arange(1000, dtype=np.int64) if comm.rank == 0 else np.full(1000, -1, np.int64)
    if comm.rank == 2:
        await asyncio.sleep(0.5)
    await comm.broadcast(b, root=0)
    ok = bool((b == np.arange(1000)).all())
    if comm.rank == 1:
        await comm.close()
    else:
        await asyncio.sleep(1.5 if comm.rank == 0 else 0.1)  # rank 0 stays until rank 2 has had its data
        comm.abort()
    print(f"RESULT {comm.rank} {'complete' if ok else 'WRONG'} - 0 :: -", flush=True)


async def diverging_knobs() -> None:
    """Rank 1 has another AIOCCL_BUFFSIZE: refused at creation, on every rank, naming ranks and values."""
    if os.environ["AIOCCL_RANK"] == "1":
        os.environ["AIOCCL_BUFFSIZE"] = "65536"
    t0 = time.monotonic()
    try:
        await aioccl.init(timeout=60)
        print(f"RESULT {os.environ['AIOCCL_RANK']} none", flush=True)
    except aioccl.AiocclError as e:
        report(int(os.environ["AIOCCL_RANK"]), e, t0)


async def main() -> None:
    if SCENARIO == "diverging_knobs":
        await diverging_knobs()
        return
    comm = await aioccl.init(timeout=60)
    await globals()[SCENARIO](comm)


asyncio.run(main())
