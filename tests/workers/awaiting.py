"""Awaiting Works, on whichever path this process took (AIOCCL_NATIVE=0: work.py's ``_AwaitingInPython``,
else the core's ``Awaiting``, native/src/py/awaiting.c). Prints ``AWAITING OK base=<class>``."""

from __future__ import annotations

import asyncio
import threading
import time

from aioccl import native
from aioccl.errors import CommAborted
from aioccl.work import Work, completed


async def main() -> None:
    base = Work.__mro__[1]
    assert (base is native.core.Awaiting) if native.core is not None else base.__name__ == "_AwaitingInPython"

    # a done Work gives its result, every kind of result, and counts as looked at
    for value in (None, 7, (1, 2), [3], StopIteration("x")):
        w = completed("all_reduce", 1, value)
        assert (await w) is value
        assert w._retrieved
    # a failed one raises its own error, every time
    w = Work("broadcast", 2)
    w._start()
    w._set_exception(CommAborted("boom"))
    for _ in range(3):
        try:
            await w
        except CommAborted as e:
            assert str(e) == "boom"
        else:
            raise AssertionError("a failed Work gave a result")
    # one done later, on another thread
    w = Work("barrier", 3)
    w._start()
    threading.Timer(0.05, w._set_result, ("late",)).start()
    assert await w == "late"

    # awaiting done Works back to back still lets the loop's other tasks run (every FAIRNESS_S: counted in
    # turns, not timed, so a loaded machine only makes it slower)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    done = completed("all_reduce", 4, 1)
    t0, awaits = time.monotonic(), 0
    while ticks < 20:
        await done
        awaits += 1
        assert time.monotonic() - t0 < 60, f"the loop's other task ran {ticks} times in 60 s of awaits"
    task.cancel()
    assert awaits > 10 * ticks, (awaits, ticks)  # (most awaits gave their result without a turn)

    # the awaitable itself, driven by hand as a generator would be: it gives the result and nothing more, after
    # one bare turn for the loop (asyncio.sleep(0)'s) when FAIRNESS_S has passed since the loop's last turn, as it
    # has here (without the sleep, a loaded machine may or may not take this process off the CPU that long)
    time.sleep(0.01)
    it = completed("all_reduce", 5, (1, 2)).__await__()
    assert it.send(None) is None, "a done Work past FAIRNESS_S gave the loop no turn"
    try:
        it.send(None)
    except StopIteration as e:
        assert e.value == (1, 2)
    else:
        raise AssertionError("the result was not given after the loop's turn")
    print(f"AWAITING OK base={base.__name__}", flush=True)


asyncio.run(main())
