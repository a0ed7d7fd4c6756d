"""An asyncio application's first day (issue 45): shutdown with receives posted, cancellation that
withdraws, and the rules an app relies on, over every transport and in real processes."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable

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




@pytest.mark.asyncio
@pytest.mark.parametrize("engine", ["inline", "thread"])
async def test_done_callbacks_run_on_the_engine_thread_whatever_the_timing(engine):
    """One rule: a done callback runs on the engine's thread and never inside add_done_callback, for an
    op done before the call (a small send), one done later, and one failed by another thread (abort)."""
    a, b = await make_comms(2, engine=engine)
    seen: list[tuple[str, int, bool]] = []
    inside = [False]
    caller = threading.get_ident()

    def on(label: str) -> Callable[[aioccl.Work], None]:
        return lambda w: seen.append((label, threading.get_ident(), inside[0] and threading.get_ident() == caller))

    def add(w: aioccl.Work, label: str) -> None:
        inside[0] = True
        w.add_done_callback(on(label))
        inside[0] = False

    try:
        engine_thread = a._engine.placement.thread_id
        small = a.isend(np.ones(2), 1, tag=1)
        await small  # done before the callback is added
        add(small, "done before")
        big = np.zeros(1 << 20)
        later = b.irecv(big, 0, tag=2)
        add(later, "done later")
        await a.isend(np.ones(1 << 20), 1, tag=2)
        await later
        for _ in range(50):
            if len(seen) == 2:
                break
            await asyncio.sleep(0.01)
        orphan = b.irecv(np.zeros(1), 0, tag=3)
        add(orphan, "aborted")
        await asyncio.to_thread(b.abort)  # completed by another thread
        for _ in range(50):
            if len(seen) == 3:
                break
            await asyncio.sleep(0.01)
        assert sorted(label for label, _, _ in seen) == ["aborted", "done before", "done later"]
        assert isinstance(orphan.exception(), aioccl.CommAborted)
        for label, thread, during in seen:
            assert thread == (engine_thread if label == "done before" else b._engine.placement.thread_id), label
            assert not during, label
    finally:
        await a.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("nbytes", [16, 8 << 20])
async def test_wait_on_the_engine_thread_raises_whatever_the_size(nbytes):
    """wait() on the inline engine's own loop raises the same error for an op already done (16 B, sent
    inside the call) as for one that is not (8 MiB), and the text says what chaining means."""
    a, b = comms = await make_comms(2)
    try:
        x = np.ones(nbytes // 8)
        w = a.isend(x, 1, tag=1)
        r = b.irecv(np.zeros_like(x), 0, tag=1)
        says = "on the engine's thread.*even for an op already done.*chain: issue the next op"
        with pytest.raises(RuntimeError, match=says):
            w.wait()
        await w
        await r
        with pytest.raises(RuntimeError, match="on the engine's thread"):
            w.wait()  # done now: still not allowed
        x2 = np.ones(4)
        calls: list[str] = []

        def chained(done: aioccl.Work) -> None:
            try:
                a.barrier().wait()
            except RuntimeError as e:
                calls.append(str(e))

        w2 = a.all_reduce(x2)
        w2.add_done_callback(chained)
        await asyncio.gather(w2, b.all_reduce(np.ones(4)))
        for _ in range(50):
            if calls:
                break
            await asyncio.sleep(0.01)
        assert len(calls) == 1 and "on the engine's thread" in calls[0]
        await b.barrier()  # the barrier the callback issued
    finally:
        await close_all(comms)


def test_an_interrupted_wait_withdraws_an_unmatched_receive():
    """Ctrl-C (a signal handler raising KeyboardInterrupt) in Work.wait() on the sync API: the
    interrupt reaches the caller as itself, the receive is withdrawn like a cancelled await, and the
    message goes to the next receive, never into the abandoned buffer."""
    a, b = asyncio.run(make_comms(2, engine="thread"))

    def interrupt(_sig: int, _frame: object) -> None:
        raise KeyboardInterrupt("the test's timer")

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        abandoned, nxt = np.full(3, -1, np.int64), np.full(3, -1, np.int64)
        w = a.irecv(abandoned, 1, tag=2)
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(KeyboardInterrupt):
            w.wait(timeout=10)
        assert w.cancelled() and a.pending() == []
        b.isend(np.arange(3, dtype=np.int64), 0, tag=2).wait(10)
        a.irecv(nxt, 1, tag=2).wait(10)
        assert nxt.tolist() == [0, 1, 2] and abandoned.tolist() == [-1] * 3
        x = [np.full(4, 1.0), np.full(4, 2.0)]
        works = [a.all_reduce(x[0]), b.all_reduce(x[1])]
        assert all((w.wait(10) == 3).all() for w in works)  # still in step
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        for c in (a, b):
            c.close().wait(10)


def test_an_interrupted_torch_backend_wait_withdraws_its_unmatched_receive():
    """The torch backend's Work.wait() interrupted (Ctrl-C): KeyboardInterrupt reaches the caller and the
    aioccl receive behind it is withdrawn, as Work.wait()'s is."""
    torch = pytest.importorskip("torch")
    from aioccl.interop.c10d.work import TorchWork

    a, b = asyncio.run(make_comms(2, engine="thread"))

    def interrupt(_sig: int, _frame: object) -> None:
        raise KeyboardInterrupt("the test's timer")

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        t = torch.full((3,), -1, dtype=torch.int64)
        inner = a.irecv(t, 1, tag=4)
        tw = TorchWork([inner], [t], "recv", None, a._engine.placement.thread_id)
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(KeyboardInterrupt):
            tw.wait()
        assert inner.cancelled() and a.pending() == []
        b.isend(np.arange(3, dtype=np.int64), 0, tag=4).wait(10)
        got = np.full(3, -1, np.int64)
        a.irecv(got, 1, tag=4).wait(10)
        assert got.tolist() == [0, 1, 2] and t.tolist() == [-1] * 3
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        for c in (a, b):
            c.close().wait(10)
