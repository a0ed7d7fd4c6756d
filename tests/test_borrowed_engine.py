"""A small op issued from a thread while the proxy engine idles runs inside the call (``Placement.borrow``)."""

from __future__ import annotations

import threading
import time

import pytest

from aioccl.placement import Placement

from conftest import launch


@pytest.fixture
def proxy():
    p = Placement.proxy_thread()
    yield p
    p.stop()


def test_an_idle_engine_is_lent_and_a_busy_one_is_not(proxy: Placement) -> None:
    assert proxy.borrow()  # the loop waits in select(): the lock is free
    assert not proxy.borrow()  # and not lent twice
    ran = threading.Event()
    proxy.loop.call_soon(ran.set)  # as an op's start would, with the engine borrowed: not thread-safe, lock held
    proxy.give_back(busy=False)  # a callback was left: the loop is woken for it
    assert ran.wait(5)
    inside, release = threading.Event(), threading.Event()
    proxy.call(lambda: (inside.set(), release.wait(5)))
    assert inside.wait(5)
    assert not proxy.borrow()  # the loop runs a callback: never waited for
    release.set()
    deadline = time.monotonic() + 5
    while not proxy.borrow():
        assert time.monotonic() < deadline
        time.sleep(0.001)
    proxy.give_back(busy=False)


def test_a_timer_set_on_a_borrowed_engine_fires(proxy: Placement) -> None:
    """The loop slept with no timer: one set while it was lent must wake it (give_back sees the new timer)."""
    fired = threading.Event()
    assert proxy.borrow()
    proxy.loop.call_later(0.01, fired.set)
    proxy.give_back(busy=False)
    assert fired.wait(5)


def test_inline_placement_lends_nothing() -> None:
    import asyncio

    async def main() -> bool:
        return Placement.inline().borrow()

    assert asyncio.run(main()) is False


@pytest.mark.parametrize("n", [2, 3])
def test_small_ops_from_threads_on_a_borrowed_engine(n: int) -> None:
    """Small all_reduces from two threads at once (ops racing to borrow the engine, or handed over when it
    is busy), with a large op between them that stays on the engine's thread: every result exact."""
    p = launch(n, "borrowed.py")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert p.stdout.count(", 0 failures") == n, p.stdout[-2000:]


def test_waiting_on_an_op_while_holding_the_borrowed_engine_raises(proxy: Placement) -> None:
    """A done callback run inside a call that borrowed the engine (an earlier op it finished) must not block
    on another op: the loop that would finish it waits for the lock this thread holds. It raises instead."""
    from aioccl.work import Work

    pending: Work[None] = Work("all_reduce", 7)
    pending._engine_thread = proxy.thread_id
    assert proxy.borrow()
    try:
        with pytest.raises(RuntimeError, match="on the engine.s thread"):
            pending.wait(timeout=1)
    finally:
        proxy.give_back(busy=False)
    with pytest.raises(TimeoutError):  # given back: an ordinary wait
        pending.wait(timeout=0.01)
