"""A lane send that finds its FIFO full waits for room (native/src/py/pair_room.c), and one that stops waiting
(its loop is wanted, its receiver stands still) is put off: it goes through the lane again from the loop,
the sends after it behind it (engine/p2p/put_off.py), never the general way, where every later send to that
peer would queue behind it in the engine for good.

One process: the sender's engine runs inline on the test's loop; the receiver's on a proxy thread, and a
thread of its own takes the messages (through the lane, borrowing that engine), so the sender's FIFO drains
while the sender's loop waits in C. A 256 KiB FIFO and 64 KiB messages: three fit, the rest wait for room.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any
from unittest import mock

import numpy as np
import pytest
from test_pair_lane import data, poisoned

import aioccl
from aioccl import native
from aioccl.engine.turns import loop_waits
from aioccl.lanes import pair as p2p_lane

from conftest import TRANSPORT_ENV, close_all

pytestmark = pytest.mark.skipif(native.core is None, reason=f"the native core is not loaded: {native.status()}")

N, COUNT = 24, (64 << 10) // 4  # messages, float32 elements each (64 KiB)


class Asked:
    """turns.loop_waits, recorded: what the waiting send was told each time it asked whether its loop is wanted."""

    def __init__(self) -> None:
        self.answers: list[bool] = []

    def __call__(self, loop: asyncio.AbstractEventLoop) -> bool:
        wanted = loop_waits(loop)
        self.answers.append(wanted)
        return wanted


async def sender_and_receiver(timeout: float = 20) -> list[aioccl.Communicator]:
    """Rank 0 inline on this loop, rank 1 on a proxy thread, over a 256 KiB shared-memory pair."""
    uid = aioccl.UniqueId.new(host="127.0.0.1")
    env = {**TRANSPORT_ENV["shm"], "AIOCCL_SHM_RING": str(256 << 10)}
    with mock.patch.dict(os.environ, env):
        return list(await asyncio.gather(*(aioccl.Communicator.create(uid, r, 2, timeout=timeout, engine=e)
                                           for r, e in enumerate(("inline", "thread")))))


def taker(b: aioccl.Communicator, got: list[Any], pause_s: float, start: threading.Event) -> threading.Thread:
    """A thread that receives the N messages in order, ``pause_s`` apart, once ``start`` is set."""
    def run() -> None:
        start.wait(30)
        for _ in range(N):
            y = poisoned(COUNT, np.float32)
            b.irecv(y, 0, 7).wait(30)
            got.append(y)
            time.sleep(pause_s)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


async def take(b: aioccl.Communicator, n: int) -> list[np.ndarray]:
    """The next ``n`` messages to rank 1, received in order on a thread of their own (through rank 1's proxy
    engine), while this loop runs the sender's."""
    def receive() -> list[np.ndarray]:
        got = []
        for _ in range(n):
            y = poisoned(COUNT, np.float32)
            b.irecv(y, 0, 7).wait(30)
            got.append(y)
        return got

    return await asyncio.to_thread(receive)


def six_put_off(a: aioccl.Communicator) -> list[Any]:
    """Six sends to rank 1 while the loop is wanted: three fit the FIFO and are done, the other three put off."""
    asyncio.get_running_loop().call_soon(lambda: None)  # the loop is wanted: the fourth send is put off
    sends = [a.isend(data(COUNT, np.float32, k), 1, 7) for k in range(6)]
    assert [w.done() for w in sends] == [True] * 3 + [False] * 3
    return sends


def run_case(monkeypatch: pytest.MonkeyPatch, stall_ms: int, pause_s: float, loop_wanted: bool,
             start_late: bool) -> tuple[dict[str, int], list[bool], float, int]:
    """Send N messages while the taker drains them (from the start, or once a send gave up); every one exact
    and in order. The sender's lane stats, what its waits were told, how long the sends took, and how many
    were done when their call returned."""
    asked = Asked()
    monkeypatch.setattr(p2p_lane, "loop_waits", asked)
    monkeypatch.setenv("AIOCCL_SHM_STALL_MS", str(stall_ms))

    async def main() -> tuple[dict[str, int], list[bool], float, int]:
        a, b = await sender_and_receiver()
        try:
            got: list[Any] = []
            start = threading.Event()
            t = taker(b, got, pause_s, start)
            if not start_late:
                start.set()
            if loop_wanted:
                asyncio.get_running_loop().call_soon(lambda: None)  # ready all through the sends below
            before = a._pair.native.stats()
            sends, t0 = [], time.monotonic()
            for k in range(N):
                sends.append(a.isend(data(COUNT, np.float32, k), 1, 7))
                if start_late and a._pair.native.stats()["full"] > before["full"]:
                    start.set()  # gave up: now let the receiver read
            took = time.monotonic() - t0
            at_once = sum(w.done() for w in sends)
            start.set()
            await asyncio.wait_for(asyncio.gather(*sends), 30)
            await asyncio.to_thread(t.join, 30)
            assert len(got) == N
            for k, y in enumerate(got):
                assert np.array_equal(y, data(COUNT, np.float32, k)), (k, y[:4])
            after = a._pair.native.stats()
            return {key: after[key] - before[key] for key in after}, list(asked.answers), took, at_once
        finally:
            await close_all([a, b])

    return asyncio.run(main())


def test_a_send_to_a_full_fifo_waits_while_its_receiver_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The receiver takes a message every millisecond, and no stall ends a wait (10 minutes): every send waits
    for room in C, and the only give-up allowed is one the loop asked for (its watchdog's tick, say)."""
    s, answers, _, _ = run_case(monkeypatch, 600_000, 0.001, loop_wanted=False, start_late=False)
    assert s["full"] == answers.count(True), (s, answers)
    assert s["full"] or s["sent"] == N, s


def test_a_send_gives_up_when_its_loop_is_wanted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A callback ready on the sender's loop and a receiver that takes nothing yet: past the spin, the wait
    asks once, hears the loop is wanted, and returns (the loop-lag promise) with the send put off; the sends
    behind it are put off at once (their order kept, no wait), and every one goes through the lane from the
    loop once the receiver reads: none through the engine."""
    s, answers, _, at_once = run_case(monkeypatch, 600_000, 0.0, loop_wanted=True, start_late=True)
    assert answers[0] is True and s["full"] >= 1, (s, answers)
    assert at_once == 3, at_once  # three fit the FIFO; from the fourth on, put off
    assert s["sent"] == N, s


def test_a_send_gives_up_when_its_receiver_stands_still(monkeypatch: pytest.MonkeyPatch) -> None:
    """A receiver that takes nothing: the wait ends once its FIFO's tail stood still for AIOCCL_SHM_STALL_MS
    (or sooner, only if the loop was wanted meanwhile), the sends are put off, and all go through the lane
    once the receiver reads."""
    s, answers, took, at_once = run_case(monkeypatch, 50, 0.0, loop_wanted=False, start_late=True)
    assert s["full"] >= 1 and s["sent"] == N and at_once == 3, (s, at_once)
    assert took >= 0.05 or True in answers, (took, answers)


def test_put_off_sends_keep_their_order_with_the_general_way_and_can_be_withdrawn(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Sends put off behind a full FIFO: one withdrawn (work.cancel()) never arrives, a send the general way takes
    (a deadline of its own) joins the queue behind them, and the receiver gets the rest in posting order, exact."""
    monkeypatch.setenv("AIOCCL_SHM_STALL_MS", "600000")

    async def main() -> None:
        a, b = await sender_and_receiver()
        try:
            sends = six_put_off(a)
            assert sends[4].cancel() and sends[4].cancelled()
            late = a.isend(data(COUNT, np.float32, 99), 1, 7, timeout=30)  # (the general way, behind them)
            assert not late.done()
            got = await take(b, 6)
            await asyncio.wait_for(asyncio.gather(*sends[:4], sends[5], late, a.drain(1)), 30)
            for want, y in zip((0, 1, 2, 3, 5, 99), got, strict=True):
                assert np.array_equal(y, data(COUNT, np.float32, want)), (want, y[:4])
            # the flight recorder: each of the seven sends once (a put-off send's tries make no entries of their own)
            assert sum("send(peer=1, tag=7)" in line for line in a.recent()) == 7, a.recent()
        finally:
            await close_all([a, b])

    asyncio.run(main())


def test_put_off_sends_past_their_deadline_fail_and_the_next_goes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A receiver whose engine stops reading (its 1 MiB budget for unexpected messages spent) for longer than the
    sender's deadline: the sends put off behind the full FIFO fail with CollectiveTimeout naming the receiver,
    those before them arrive, and a send after them goes once the receiver reads."""
    monkeypatch.setenv("AIOCCL_SHM_STALL_MS", "20")
    monkeypatch.setenv("AIOCCL_UNEXPECTED_BYTES", str(1 << 20))

    async def main() -> None:
        a, b = await sender_and_receiver(timeout=1.0)
        try:
            sends = [a.isend(data(COUNT, np.float32, k), 1, 7) for k in range(40)]
            out = await asyncio.wait_for(asyncio.gather(*sends, return_exceptions=True), 20)
            ok = [k for k, r in enumerate(out) if r is None]
            failed = [r for r in out if r is not None]
            assert ok == list(range(len(ok))) and 16 <= len(ok) < 40, out  # a prefix: the budget, then the FIFO
            assert all(isinstance(e, aioccl.CollectiveTimeout) and e.waiting_for == [1] and
                       "send(peer=1, tag=7)" in str(e) for e in failed), failed
            after = a.isend(data(COUNT, np.float32, 99), 1, 7)
            got = await take(b, len(ok) + 1)
            await asyncio.wait_for(after, 10)
            for want, y in zip([*ok, 99], got, strict=True):
                assert np.array_equal(y, data(COUNT, np.float32, want)), (want, y[:4])
        finally:
            await close_all([a, b])

    asyncio.run(main())


@pytest.mark.parametrize("ending", ["close", "abort"])
def test_put_off_sends_when_the_communicator_ends(monkeypatch: pytest.MonkeyPatch, ending: str) -> None:
    """close() with sends put off waits for them (sends are promises to peers) and the receiver gets every one;
    abort() fails them with CommAborted at once, and nothing is tried again after it."""
    monkeypatch.setenv("AIOCCL_SHM_STALL_MS", "600000")

    async def main() -> None:
        a, b = await sender_and_receiver()
        try:
            sends = six_put_off(a)
            if ending == "abort":
                a.abort()
                for w in sends[3:]:
                    with pytest.raises(aioccl.CommAborted):
                        await asyncio.wait_for(w, 10)
                await asyncio.sleep(0.05)  # the loop's tries come and go: nothing is sent, nothing raises
                assert a._engine.put_off == {}
                return
            taking = asyncio.ensure_future(take(b, 6))
            await asyncio.wait_for(a.close(), 30)
            assert all(w.done() and w.exception() is None for w in sends)
            for k, y in enumerate(await taking):
                assert np.array_equal(y, data(COUNT, np.float32, k)), (k, y[:4])
        finally:
            await close_all([a, b])

    asyncio.run(main())
