"""aioccl's ``Work`` as torch's: ``wait()``, ``get_future()``, and errors torch users catch.

One torch ``Work`` may stand for several aioccl ops (a coalesced call, an
uneven all-to-all made of sends and receives); it completes when the last
one does, after ``finish`` (copying a gathered result out into the caller's
list of tensors). Completion happens on aioccl's engine thread, which is
also where the future's callbacks run (DDP's bucket hooks among them), as
they run on Gloo's own threads.

Errors arrive as ``torch.distributed.DistBackendError`` carrying aioccl's
message (the op, its sequence number, the ranks it waited for) with the
aioccl exception as ``__cause__``: ``except DistBackendError`` catches a
timeout, a lost peer and a mismatch, and ``e.__cause__`` tells them apart.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ... import lowlevel
from ...errors import CollectiveTimeout
from ...placement import lent_here
from ...work import Work


def backend_error(exc: BaseException) -> dist.DistBackendError:
    """``exc`` as torch users catch it (a ``DistBackendError`` is already one). A timeout reads the way torch's
    own backends say it (`` Timed out ``: what torch's suite and its users' code match), then aioccl's own
    account: the op, its sequence number and the silent ranks."""
    if isinstance(exc, dist.DistBackendError):
        return exc
    if isinstance(exc, CollectiveTimeout):
        err = dist.DistBackendError(f"aioccl: Timed out waiting for ranks {exc.waiting_for}: {exc}")
    else:
        err = dist.DistBackendError(f"aioccl: {exc}")
    err.__cause__ = exc
    return err


_BORN_DONE_LOCK = threading.Lock()


class TorchWork(dist.Work):
    """Done when every aioccl op in ``works`` is, then ``finish()`` has run; its result is ``result``.

    Lean on purpose, since a small op costs less than torch's objects: the future torch sees and the event a
    blocked waiter sleeps on are made only when asked for (``dist.all_reduce`` asks for neither when the op
    finished inside the call)."""

    # what a Work born done never changes, as class defaults: its __init__ sets only the rest (per call, each
    # attribute set costs more than the collective's own Python)
    _exc: BaseException | None = None
    _done = False
    _settled = False  # the outcome is known and the future (if any) being resolved; _done follows
    _event: threading.Event | None = None  # made by a waiter that has to block
    _base: torch.futures.Future[None] | None = None  # made by get_future
    _future: torch.futures.Future[list[torch.Tensor]] | None = None

    def __init__(self, works: list[Work[Any]], result: list[torch.Tensor], what: str,
                 finish: Callable[[], None] | None = None, engine_thread: int | None = None,
                 source: Work[Any] | None = None) -> None:
        super().__init__()
        self._result, self._what, self._finish = result, what, finish
        self._source = source  # a receive: the aioccl Work whose status names the sender
        self._works = works  # withdrawn (where still unmatched) when a wait for them is interrupted
        self._engine_thread = engine_thread
        if len(works) == 1 and finish is None and works[0].done():
            # a small op done inside the call (the common case): nobody else can see this Work yet, so its
            # outcome is set without the locks and callbacks a Work finished later needs (get_future's brief
            # hold of a lock is all it can take: one shared lock serves them)
            exc = works[0].exception()
            if exc is not None:
                self._exc = backend_error(exc)
            self._lock = _BORN_DONE_LOCK
            self._left = 0
            self._settled = self._done = True
            return
        self._lock = threading.Lock()
        self._left = len(works)
        if not works:
            self._complete()
        for w in works:
            lowlevel.on_done(w, self._one_done)

    def _one_done(self, w: Work[Any]) -> None:
        exc = w.exception()  # (marks it seen: aioccl's exit report leaves it alone)
        with self._lock:
            if exc is not None and self._exc is None:
                self._exc = backend_error(exc)
            self._left -= 1
            last = self._left == 0
        if last:
            self._complete()

    def _complete(self) -> None:
        if self._exc is None and self._finish is not None:
            try:
                self._finish()
            except Exception as e:  # noqa: BLE001  (a bug here must not leave the future pending)
                self._exc = backend_error(e)
        # the future first, then done and the waiters: a caller back from wait() (or seeing is_completed())
        # finds the future done too, as on Gloo. A get_future() from here on resolves its own future.
        with self._lock:
            self._settled = True
            base = self._base
        if base is not None:
            base.set_result(None)  # runs _outcome: the result, or the error as a failed future
        with self._lock:
            self._done = True
            event = self._event
        if event is not None:
            event.set()

    def _outcome(self, _base: torch.futures.Future[None]) -> list[torch.Tensor]:
        if self._exc is not None:
            raise self._exc
        return self._result

    # -- torch's Work ----------------------------------------------------------------------------------
    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        """Block until done (each aioccl op has its own deadline, so this ends); ``timeout`` > 0 bounds
        the wait itself, as torch's ``Work.wait(timeout)`` does."""
        if not self._done:
            if threading.get_ident() == self._engine_thread or lent_here():
                raise RuntimeError(f"{self._what}: wait() on aioccl's engine thread would deadlock; chain "
                                   "on get_future() instead")
            with self._lock:
                if not self._done and self._event is None:
                    self._event = threading.Event()
                event = self._event
            seconds = timeout.total_seconds() if timeout is not None else 0.0
            try:
                finished = event is None or event.wait(seconds if seconds > 0 else None)
            except BaseException:  # interrupted (Ctrl-C): an unmatched receive is withdrawn, as aioccl's wait does
                for w in self._works:
                    lowlevel.abandon(w)
                raise
            if not finished:
                raise dist.DistBackendError(f"aioccl: {self._what} not done after wait(timeout={seconds:g}s)")
        if self._exc is not None:
            raise self._exc
        return True

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        """torch's future of the result. It is chained on a private one whose callback raises on failure: that
        marks it failed in C++ (setError), which DDP's reducer checks. ``Future.set_exception`` stores the
        exception as the *value* instead, and the reducer, reading it as tensors, crashed the process with
        SIGSEGV (issue 35: a survivor of a killed peer)."""
        with self._lock:
            if self._future is None:
                self._base = torch.futures.Future()
                self._future = self._base.then(self._outcome)
                resolve = self._settled
            else:
                resolve = False
            fut = self._future
        if resolve:
            assert self._base is not None
            self._base.set_result(None)
        return fut

    def is_completed(self) -> bool:
        return self._done

    def is_success(self) -> bool:
        return self._done and self._exc is None

    def exception(self) -> BaseException | None:
        return self._exc

    def result(self) -> list[torch.Tensor]:
        return self._result

    def synchronize(self) -> None:
        self.wait()

    def _source_rank(self) -> int:
        """A receive's sender (in the group), once done: what ``dist.recv(t)`` without ``src`` returns."""
        if self._source is None or not self._done or self._source.status is None:
            raise RuntimeError(f"{self._what}: the source rank is known only for a completed receive")
        return int(self._source.status.source)

    source_rank = _source_rank


def as_aioccl(w: TorchWork) -> Work[Any]:
    """A torch Work of ours as an aioccl Work (done when it is), so several can be waited for as one."""
    out = lowlevel.new_work(w._what)

    def done(f: torch.futures.Future[Any]) -> None:
        try:
            f.value()
        except Exception as e:  # noqa: BLE001  (the op's error, already a DistBackendError)
            lowlevel.finish(out, exc=e)
        else:
            lowlevel.finish(out)

    w.get_future().add_done_callback(done)
    return out
