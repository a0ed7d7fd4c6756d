"""Which async library is running the caller: asyncio (anyio's asyncio backend included) or trio.

The engine always runs on an asyncio loop. Under asyncio it may run on the
caller's own loop (``engine="inline"``); under trio it runs on a proxy
thread, and the caller only needs three things from trio: to park a task
until a ``Work`` completes on the engine's thread, to
wait for a thread's future (communicator creation), and to run a blocking
call on a worker thread. Those live here so that ``aioccl.work`` and
``aioccl.communicator`` name no async library but asyncio. trio is
never imported here: if a trio task is running, trio is in ``sys.modules``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .work import Work

T = TypeVar("T")


def current() -> str:
    """``"asyncio"`` or ``"trio"``; RuntimeError outside of both (use the blocking API there)."""
    try:
        asyncio.get_running_loop()
        return "asyncio"
    except RuntimeError:
        pass
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            trio.lowlevel.current_task()
            return "trio"
        except RuntimeError:
            pass
    raise RuntimeError("aioccl's async API needs a running asyncio loop or trio run; "
                       "from plain threads use aioccl.init_sync() and Work.wait()")


async def trio_wait(work: Work[Any]) -> Any:
    """Park the current trio task until ``work`` is done; cancelling the task withdraws the op where
    ``Work._abandoned`` can (an unmatched receive), is refused for a receive that has its message, and else
    leaves the op running."""
    trio = sys.modules["trio"]
    if work.done():
        if work._keeps_its_message():  # (a cancel here would lose the message: a schedule point, no cancel)
            await trio.lowlevel.cancel_shielded_checkpoint()
        else:
            await trio.lowlevel.checkpoint()
        return work.result()
    task = trio.lowlevel.current_task()
    token = trio.lowlevel.current_trio_token()
    parked = [True]

    def reschedule() -> None:  # on the trio thread
        if parked[0]:
            parked[0] = False
            trio.lowlevel.reschedule(task)

    def wake(_w: Work[Any]) -> None:  # on the engine's thread, or here if already done
        try:
            token.run_sync_soon(reschedule)
        except trio.RunFinishedError:
            pass

    def abort(_raise_cancel: Any) -> Any:
        if not work._abandoned():  # a receive that has its message: refused, as Trio's own ops past their
            return trio.lowlevel.Abort.FAILED  # point of no return do (the task is woken when it is done)
        parked[0] = False
        return trio.lowlevel.Abort.SUCCEEDED

    work._on_done(wake)
    await trio.lowlevel.wait_task_rescheduled(abort)
    return work.result()


async def wait_future(fut: concurrent.futures.Future[T]) -> T:
    """Await a future completed by another thread, under either library."""
    if current() == "asyncio":
        return await asyncio.wrap_future(fut)
    trio = sys.modules["trio"]
    return await trio.to_thread.run_sync(fut.result, abandon_on_cancel=True)  # type: ignore[no-any-return]


async def to_thread(fn: Callable[[], T]) -> T:
    """Run a blocking call on a worker thread, under either library."""
    if current() == "asyncio":
        return await asyncio.to_thread(fn)
    trio = sys.modules["trio"]
    return await trio.to_thread.run_sync(fn)  # type: ignore[no-any-return]
