"""A host callback interrupted on the main thread leaves nothing of its op in XLA's buffers.

A signal handler that raises (Ctrl-C's ``KeyboardInterrupt``) runs on the main thread, between any two
bytecodes of whatever Python runs there: when XLA runs a host callback on the main thread (jax 0.12 on
CPU), anywhere in the callback. XLA then fails the computation and frees or reuses its buffers, while
the op may go on in the engine and write its result (or let a peer read its input in place) in memory
that is no longer the op's. Worse, an interrupt can land *inside* the issue of an op: after it took its
sequence number, before the engine had it (the peers then wait for it forever), or after a helper thread
was handed the op but before the caller knew (it then runs on freed buffers).

So the main thread runs no op itself: it hands the call to the *guard*, one thread that no signal reaches,
and waits. Handing over is one C call (``SimpleQueue.put``), and the job's state moves under its own lock,
so an interrupt at any point leaves the job in one of three states the caller can tell apart:

- not started: it is dropped (the guard skips it), nothing was issued, the interrupt is raised;
- running: the interrupt is held until the job has issued all its ops (a call issues every op before its
  first wait: ``aioccl.work.BEFORE_BLOCKING`` says when), so the next op cannot overtake them; then an
  unmatched receive is withdrawn (the peer's message goes to the next receive) and the rest run on;
- ended: the interrupt is raised.

A small call (up to ``COPY_LIMIT`` bytes of buffers) runs on copies, so the caller raises as soon as its
ops are issued and the job finishes on its own buffers in the background, keeping the communicator in
step. A large one runs on XLA's buffers (two copies would cost more than the wait), so the interrupt is
held until it has ended. An op the native core already started (``wait_guarded``) is never dropped: the
peers count on it; its handler calls again if an interrupt lands before the op was taken on, and the job
runs once. Other threads never see a signal, so callbacks there run the op directly.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np

from aioccl import Communicator, lowlevel
from aioccl.work import BEFORE_BLOCKING

RunFn = Any  # run(comm, ins, outs, same, **params): issues every op before its first wait
COPY_LIMIT = 1 << 20  # bytes of a call's buffers up to which it runs on copies, so an interrupt returns early
_NEW, _RUNNING, _DROPPED, _ENDED = range(4)


class Job:
    """One call handed to the guard. ``state`` moves under ``lock`` only: the guard takes a NEW job, an
    interrupted caller drops one; a job handed over twice (a retry) runs once."""

    __slots__ = ("fn", "lock", "state", "error", "issued", "done")

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        self.lock = threading.Lock()
        self.state = _NEW
        self.error: BaseException | None = None
        self.issued = threading.Event()  # every op of the call is issued (set at the end too)
        self.done = threading.Event()

    def run(self) -> None:
        """Run ``fn`` here unless it was taken or dropped before."""
        with self.lock:
            if self.state != _NEW:
                return
            self.state = _RUNNING
        before, BEFORE_BLOCKING.hook = BEFORE_BLOCKING.hook, self.issued.set
        try:
            self.fn()
        except BaseException as e:  # noqa: BLE001 - the caller's to raise
            self.error = e
        finally:
            BEFORE_BLOCKING.hook = before
            with self.lock:
                self.state = _ENDED
            self.issued.set()
            self.done.set()


class _Guard:
    """The thread that runs the main thread's calls, one at a time in the order handed over."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="aioccl-jax-guard", daemon=True).start()

    def _serve(self) -> None:
        while True:
            self.jobs.get().run()


_guard: _Guard | None = None
_guard_lock = threading.Lock()


def _the_guard() -> _Guard:
    global _guard
    with _guard_lock:
        if _guard is None:
            _guard = _Guard()
        return _guard


def _forget_guard() -> None:  # a forked child has none of its parent's threads (nor their locks' holders)
    global _guard, _guard_lock
    _guard, _guard_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_guard)


def run_guarded(run: RunFn, comm: Communicator, ins: list[Any], outs: list[Any], same: bool,
                **params: Any) -> None:
    """``run(comm, ins, outs, same, **params)`` such that an interrupt leaves ``ins`` and ``outs`` alone and
    the communicator in step."""
    if threading.current_thread() is not threading.main_thread() or not all(
            isinstance(a, np.ndarray) for a in (*ins, *outs)):
        run(comm, ins, outs, same, **params)  # no signal reaches this thread (GPU views stay on the stream)
        return
    before = lowlevel.in_flight(comm)
    own = sum(a.nbytes for a in (*ins, *outs)) <= COPY_LIMIT
    if own:
        a = [np.array(x, copy=True) for x in ins]
        b = [a[0] if same and k == 0 else np.empty_like(o) for k, o in enumerate(outs)]
    else:
        a, b = ins, outs
    _through_guard(Job(lambda: run(comm, a, b, same, **params)), droppable=True,
                   withdraw=lambda: withdraw_new(comm, before), to_end=not own)
    if own:
        for o, mine in zip(outs, b, strict=True):
            np.copyto(o, mine)


def wait_guarded(job: Job) -> None:
    """Run ``job`` and wait for its end, raising its error: an op the native core started on XLA's buffers,
    which the peers count on. Never dropped, run once however often this is called for it (a retry after an
    interrupt); on the main thread through the guard, an interrupt held until the job has ended."""
    if threading.current_thread() is not threading.main_thread():
        job.run()
        job.done.wait()
        if job.error is not None:
            raise job.error
        return
    _through_guard(job, droppable=False, withdraw=None, to_end=True)


def _through_guard(job: Job, *, droppable: bool, withdraw: Callable[[], None] | None, to_end: bool) -> None:
    interrupt: BaseException | None = None
    try:
        _the_guard().jobs.put(job)
        job.done.wait()
    except BaseException as e:  # noqa: BLE001 - an interrupt, anywhere from before the put to after the end
        interrupt = e
    if interrupt is not None:
        _settle(job, interrupt, droppable, withdraw, to_end)
    if job.error is not None:
        raise job.error


def _settle(job: Job, interrupt: BaseException, droppable: bool, withdraw: Callable[[], None] | None,
            to_end: bool) -> NoReturn:
    """Hold ``interrupt`` (and any that follow) until ``job`` is dropped, issued or ended, as its buffers
    require; then raise it."""
    withdrawn = False
    while True:
        try:
            with job.lock:
                if job.state == _NEW and droppable:
                    job.state = _DROPPED
                state = job.state
            if state == _DROPPED:
                break
            if state == _NEW:  # interrupted before or after the put: queue it (again); it runs once
                _the_guard().jobs.put(job)
            job.issued.wait()
            if withdraw is not None and not withdrawn:
                withdraw()
                withdrawn = True
            if to_end:
                job.done.wait()
            break
        except BaseException:  # noqa: BLE001, S112 - another interrupt meanwhile: the first is the one raised
            continue
    raise interrupt


def withdraw_new(comm: Communicator, before: set[Any]) -> None:
    """The ops this call issued: an unmatched receive is withdrawn, the rest run on (on their own buffers),
    none reported at exit as never awaited (the app was told, by the interrupt)."""
    for w in lowlevel.in_flight(comm) - before:
        w.cancel("when the host callback waiting for it was interrupted")
        lowlevel.mark_retrieved(w)
