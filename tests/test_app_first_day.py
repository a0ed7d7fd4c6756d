"""An asyncio application's first day (issue 45): shutdown with receives posted, cancellation that
withdraws, and the rules an app relies on, over every transport and in real processes."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import aioccl

from conftest import TRANSPORT_ENV, close_all, launch, make_comms


@pytest.mark.parametrize("case", ["close", "async_with", "cancelled"])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_close_with_a_posted_receive_returns_at_once(case, transport):
    """A pipeline's receiver is waiting when the app shuts down: close() withdraws the receive
    (OpCancelled naming it), returns at once, and nothing is reported at exit."""
    proc = launch(2, "app_shutdown.py", case, env=TRANSPORT_ENV[transport], timeout=60)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert proc.stdout.count(", 0 failures") == 2, out[-2000:]
    assert "Warning" not in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("transport", ["tcp", "shm", "ib"])
@pytest.mark.parametrize("how", ["asyncio.timeout", "task.cancel", "wait_for"])
@pytest.mark.asyncio
async def test_cancelling_the_await_withdraws_an_unmatched_receive(transport, how):
    """The abandoned receive takes no message: the next one gets the first message sent, the
    abandoned buffer keeps its poison, and pending() no longer lists it."""
    a, b = comms = await make_comms(2, transport=transport)
    try:
        first, second = np.full(4, -1, np.int64), np.full(4, -1, np.int64)
        w = a.irecv(first, 1, tag=3)
        if how == "asyncio.timeout":
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.1):
                    await w
        elif how == "wait_for":
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(w, 0.1)
        else:
            task = asyncio.create_task(_awaited(w))
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert w.cancelled() and a.pending() == []
        with pytest.raises(aioccl.OpCancelled, match="when the task awaiting it was cancelled"):
            w.result()
        await b.isend(np.full(4, 1, np.int64), 0, tag=3)
        await b.isend(np.full(4, 2, np.int64), 0, tag=3)
        await a.irecv(second, 1, tag=3)
        assert second.tolist() == [1] * 4 and first.tolist() == [-1] * 4
        await a.irecv(second, 1, tag=3)
        assert second.tolist() == [2] * 4
        # a wildcard receive is withdrawn the same way
        wild = a.irecv(first, aioccl.ANY_SOURCE, tag=aioccl.ANY_TAG)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await wild
        assert wild.cancelled() and a.pending() == []
    finally:
        await close_all(comms)


@pytest.mark.asyncio
async def test_a_matched_receive_and_a_collective_run_on_when_their_await_is_cancelled():
    """Only what no peer can have seen is withdrawn: a collective is a promise to the peers."""
    a, b = comms = await make_comms(2)
    try:
        x0, x1 = np.ones(4), np.full(4, 2.0)
        w = a.all_reduce(x0)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await w
        assert not w.cancelled()
        await b.all_reduce(x1)
        assert await w is x0 and x0.tolist() == [3.0] * 4
    finally:
        await close_all(comms)


@pytest.mark.asyncio
async def test_a_withdrawn_work_fails_a_task_group_it_does_not_quietly_end_it():
    """Awaiting a Work that another task withdrew raises OpCancelled, an error: a TaskGroup reports it
    instead of taking it for its own cancellation (which asyncio.CancelledError would be)."""
    a, b = comms = await make_comms(2)
    try:
        w = a.irecv(np.zeros(2), 1, tag=1)
        with pytest.raises(ExceptionGroup) as caught:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(_awaited(w))
                await asyncio.sleep(0.02)
                assert w.cancel()
        assert [type(e) for e in caught.value.exceptions] == [aioccl.OpCancelled]
        assert not issubclass(aioccl.OpCancelled, asyncio.CancelledError)
    finally:
        await close_all(comms)


async def _awaited(w: aioccl.Work) -> object:
    return await w


