"""jax_ext's guard (jax_ext/interrupts.py) against a real signal at chosen moments, in one process: what an
interrupted caller leaves behind for each state of its call (not started, issuing, issued, ended)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("jax")

from aioccl.work import Work  # noqa: E402
from jax_ext import interrupts  # noqa: E402
from jax_ext.interrupts import Job  # noqa: E402


class Interrupt(BaseException):
    pass


DELIVERED = threading.Event()  # the last signal's handler has run


@pytest.fixture
def interrupt_at() -> Iterator[Callable[[float], None]]:
    """``interrupt_at(s)``: a signal whose handler raises ``Interrupt`` reaches the main thread in ``s``
    (then ``DELIVERED`` is set)."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach only the main thread, and this test does not run there")

    def raise_it(_sig: int, _frame: Any) -> None:
        DELIVERED.set()
        raise Interrupt("the test's signal")

    old = signal.signal(signal.SIGALRM, raise_it)
    timers: list[threading.Timer] = []
    main = threading.main_thread().ident
    assert main is not None

    def arm(s: float) -> None:
        DELIVERED.clear()
        t = threading.Timer(s, signal.pthread_kill, (main, signal.SIGALRM))
        t.start()
        timers.append(t)

    yield arm
    for t in timers:
        t.join()
    signal.signal(signal.SIGALRM, old)


def busy_guard() -> threading.Event:
    """Keep the guard on a job until the returned event is set."""
    release = threading.Event()
    interrupts._the_guard().jobs.put(Job(release.wait))
    return release


def after_the_signal(fn: Callable[[], Any]) -> None:
    """``fn()`` on another thread, 50 ms after the signal's handler ran."""
    threading.Thread(target=lambda: (DELIVERED.wait(10), time.sleep(0.05), fn())).start()


def drain_guard() -> None:
    """Wait until the guard has run everything handed to it so far."""
    last = Job(lambda: None)
    interrupts._the_guard().jobs.put(last)
    assert last.done.wait(10)


def test_a_call_not_yet_started_is_dropped(interrupt_at: Callable[[float], None]) -> None:
    ran: list[int] = []
    release = busy_guard()
    interrupt_at(0.05)
    with pytest.raises(Interrupt):
        interrupts._through_guard(Job(lambda: ran.append(1)), droppable=True, withdraw=None, to_end=True)
    release.set()
    drain_guard()
    assert ran == []


def test_a_started_call_is_held_until_its_ops_are_issued(interrupt_at: Callable[[float], None]) -> None:
    """The call issues for 0.3 s, then waits: the interrupt at 0.05 s is raised once it waits, after the
    withdrawal; the call runs on to its end in the background."""
    op: Work[None] = Work("recv", 0)
    steps: list[str] = []

    def call() -> None:
        time.sleep(0.3)
        steps.append("issued")
        op.wait()
        steps.append("ended")

    t0 = time.monotonic()
    interrupt_at(0.05)
    with pytest.raises(Interrupt):
        interrupts._through_guard(Job(call), droppable=True, withdraw=lambda: steps.append("withdrawn"),
                                  to_end=False)
    assert time.monotonic() - t0 >= 0.3
    assert steps == ["issued", "withdrawn"]
    op._set_result(None)
    drain_guard()
    assert steps == ["issued", "withdrawn", "ended"]


def test_a_call_on_the_callers_buffers_is_held_to_its_end(interrupt_at: Callable[[float], None]) -> None:
    op: Work[None] = Work("all_reduce", 0)
    steps: list[str] = []

    def call() -> None:
        op.wait()
        steps.append("ended")

    interrupt_at(0.05)
    after_the_signal(lambda: op._set_result(None))
    with pytest.raises(Interrupt):
        interrupts._through_guard(Job(call), droppable=True, withdraw=lambda: steps.append("withdrawn"),
                                  to_end=True)
    assert steps == ["withdrawn", "ended"]


def test_a_started_native_op_is_never_dropped_and_runs_once(interrupt_at: Callable[[float], None]) -> None:
    """Interrupted while the guard is busy (the job not started), then handed over again (the handler's
    call again): it runs once, and the interrupt comes after its end."""
    ran: list[int] = []
    job = Job(lambda: ran.append(1))
    release = busy_guard()
    interrupt_at(0.05)
    after_the_signal(release.set)
    with pytest.raises(Interrupt):
        interrupts.wait_guarded(job)
    assert ran == [1] and job.done.is_set()
    interrupts.wait_guarded(job)  # again: already ended, nothing runs
    drain_guard()
    assert ran == [1]


def test_an_error_of_the_call_is_raised_and_off_the_main_thread_it_runs_in_place() -> None:
    def fail() -> None:
        raise ValueError("the op's own error")

    if threading.current_thread() is threading.main_thread():
        with pytest.raises(ValueError, match="own error"):
            interrupts._through_guard(Job(fail), droppable=True, withdraw=None, to_end=True)
    where: list[str] = []
    t = threading.Thread(target=lambda: interrupts.wait_guarded(Job(
        lambda: where.append(threading.current_thread().name))), name="xla-thread")
    t.start()
    t.join()
    assert where == ["xla-thread"]
