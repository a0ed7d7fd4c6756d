"""A lane send that finds its FIFO full waits for room (native/src/py/pair_room.c) instead of going the
general way, where every later send to that peer would queue behind it in the engine.

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
from aioccl import native, p2p_lane
from aioccl.engine.turns import loop_waits

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


async def sender_and_receiver() -> list[aioccl.Communicator]:
    """Rank 0 inline on this loop, rank 1 on a proxy thread, over a 256 KiB shared-memory pair."""
    uid = aioccl.UniqueId.new(host="127.0.0.1")
    env = {**TRANSPORT_ENV["shm"], "AIOCCL_SHM_RING": str(256 << 10)}
    with mock.patch.dict(os.environ, env):
        return list(await asyncio.gather(*(aioccl.Communicator.create(uid, r, 2, timeout=20, engine=e)
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


def run_case(monkeypatch: pytest.MonkeyPatch, stall_ms: int, pause_s: float, loop_wanted: bool,
             start_late: bool) -> tuple[dict[str, int], list[bool], float]:
    """Send N messages while the taker drains them (from the start, or once a send gave up); every one exact
    and in order. The sender's lane stats, what its waits were told, and how long the sends took."""
    asked = Asked()
    monkeypatch.setattr(p2p_lane, "loop_waits", asked)
    monkeypatch.setenv("AIOCCL_SHM_STALL_MS", str(stall_ms))

    async def main() -> tuple[dict[str, int], list[bool], float]:
        a, b = await sender_and_receiver()
        try:
            got: list[Any] = []
            start = threading.Event()
            t = taker(b, got, pause_s, start)
            if not start_late:
                start.set()
            if loop_wanted:
                asyncio.get_running_loop().call_soon(lambda: None)  # ready all through the sends below
            before = a._pair_lane.stats()
            sends, t0 = [], time.monotonic()
            for k in range(N):
                sends.append(a.isend(data(COUNT, np.float32, k), 1, 7))
                if start_late and a._pair_lane.stats()["full"] > before["full"]:
                    start.set()  # gave up: now let the receiver read
            took = time.monotonic() - t0
            start.set()
            await asyncio.wait_for(asyncio.gather(*sends), 30)
            await asyncio.to_thread(t.join, 30)
            assert len(got) == N
            for k, y in enumerate(got):
                assert np.array_equal(y, data(COUNT, np.float32, k)), (k, y[:4])
            after = a._pair_lane.stats()
            return {key: after[key] - before[key] for key in after}, list(asked.answers), took
        finally:
            await close_all([a, b])

    return asyncio.run(main())


def test_a_send_to_a_full_fifo_waits_while_its_receiver_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The receiver takes a message every millisecond, and no stall ends a wait (10 minutes): every send waits
    for room in C, and the only give-up allowed is one the loop asked for (its watchdog's tick, say)."""
    s, answers, _ = run_case(monkeypatch, 600_000, 0.001, loop_wanted=False, start_late=False)
    assert s["full"] == answers.count(True), (s, answers)
    assert s["full"] or s["sent"] == N, s


def test_a_send_gives_up_when_its_loop_is_wanted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A callback ready on the sender's loop and a receiver that takes nothing yet: past the spin, the wait
    asks once, hears the loop is wanted, and hands the send to the engine (the loop-lag promise); the sends
    behind it follow it there (their order kept), and all arrive once the receiver reads."""
    s, answers, _ = run_case(monkeypatch, 600_000, 0.0, loop_wanted=True, start_late=True)
    assert s["full"] == 1 and answers == [True] and s["sent"] < N, (s, answers)


def test_a_send_gives_up_when_its_receiver_stands_still(monkeypatch: pytest.MonkeyPatch) -> None:
    """A receiver that takes nothing: the wait ends once its FIFO's tail stood still for AIOCCL_SHM_STALL_MS
    (or sooner, only if the loop was wanted meanwhile), and the messages arrive once the receiver reads."""
    s, answers, took = run_case(monkeypatch, 50, 0.0, loop_wanted=False, start_late=True)
    assert s["full"] == 1 and s["sent"] < N, s
    assert took >= 0.05 or True in answers, (took, answers)
