"""Following every op from its call to its end: what ``pending()`` lists, the flight recorder, the
watchdog's and the exit report's lists, and the warning a timeout logs.

A part of each ``Communicator`` (``Tracker``), given its engine and state. An op issued on the
engine's own thread starts inside the call, and one that finishes there (a small send, a message
that had arrived) is only written to the flight recorder: tracking it as in flight first would
cost more than the op itself.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import log, watchdog
from .errors import CollectiveTimeout
from .group import current_group
from .introspection import PendingOp, pending_op
from .work import Work

if TYPE_CHECKING:
    from .engine.engine import Engine
    from .state import CommState

_log = log.get("COLL")


class Tracker:
    """Follows the ops of one communicator (``state``) on ``engine``."""

    def __init__(self, engine: Engine, state: CommState) -> None:
        self._engine = engine
        self._state = state

    def track(self, work: Work[Any], desc: Any, start: Callable[..., Any], *args: Any,
               borrow: bool = False, origin: bool = False) -> Work[Any]:
        """Start ``start(*args)`` for ``work`` (at once, or with its group) and follow it to its end.

        ``borrow``: from another thread, start it here when the engine is idle (``Placement.borrow``);
        for starts that keep issue order themselves (a shared-memory channel's ops) and small ops only.
        ``origin``: note where in the app the op was issued, for the exit report's warning should it fail
        unawaited (a message's: a pipeline's receives posted ahead). It walks the stack up to the app's frame:
        about 3,000 instructions a frame, so not for collectives, whose general way is measured per call."""
        eng = self._engine
        work._bind(eng.placement)
        thread = eng.placement.thread_id
        work._t0 = time.monotonic()
        work._desc = desc
        state = self._state
        if state.member_lost is not None:  # a rank of it was lost: every op fails alike, until shrink()
            # a collective's own failure, told by a peer first (a timeout), is what the others raise for it
            doomed = eng.mailbox.doomed(state.view.ctx, work.seq) if "(" not in work.op else None
            work._set_exception(doomed or state.member_lost)
            self.record(work)
            return work
        pending = current_group.get()
        if borrow and pending is None and thread != threading.get_ident() and eng.placement.borrow():
            try:
                self._start_here(work, start, origin, *args)
            finally:
                eng.placement.give_back(busy=not work.done())
            return work
        if pending is None and thread == threading.get_ident():
            return self._start_here(work, start, origin, *args)
        state.inflight.add(work)
        watchdog.pending.add(work)
        if origin:
            watchdog.origin[work] = watchdog.issued_from()
            work._on_done(self._finished_noted)
        else:
            work._on_done(self._finished)
        begin = functools.partial(start, *args) if args else start
        if pending is not None:
            pending.append((eng.launch, begin, work))
        else:
            eng.launch(begin)
        return work

    def _start_here(self, work: Work[Any], start: Callable[..., Any], origin: bool, *args: Any) -> Work[Any]:
        """Start the op in this call, on the engine's thread (or with the engine borrowed): only completions
        there can race with it, so an op that finishes inside (a small send, an arrived message over shared
        memory) is recorded without being tracked first."""
        coro = start(*args)
        if work.done():
            self.record(work)
        else:
            self._state.inflight.add(work)
            watchdog.pending.add(work)
            if origin:
                watchdog.origin[work] = watchdog.issued_from()
                work._on_done(self._finished_noted)
            else:
                work._on_done(self._finished)
        if coro is not None:
            self._engine.spawn(coro)
        return work

    def _finished(self, work: Work[Any]) -> None:
        """Done callback of every op (engine thread): record it; a timeout gets the recorder's story."""
        self._state.inflight.discard(work)
        watchdog.pending.discard(work)
        self.record(work)

    def _finished_noted(self, work: Work[Any]) -> None:
        """``_finished`` for an op whose origin in the app was noted (``track(origin=True)``)."""
        self._state.inflight.discard(work)
        watchdog.pending.discard(work)
        self.record(work, watchdog.origin.pop(work, None))

    def record(self, work: Work[Any], where: tuple[Any, int] | None = None) -> None:
        """Into the flight recorder with it (and a failure into the exit report, with where in the app it was
        issued from (``watchdog.issued_from``), when it was followed in flight)."""
        work._probe = None  # it may reference the op, which references the Work: no cycle for the GC
        state = self._state
        state.recorder.add(work)
        exc = work._exc
        if exc is not None:
            watchdog.failed.append((work, where))  # reported at exit if nobody ever looked at its error
        if isinstance(exc, CollectiveTimeout):
            exc.comm = exc.comm or f"{state.view.ctx:x}"
            now = time.monotonic()
            exc.recent = state.recorder.lines() + [f"in flight: {pending_op(w, now)}" for w in list(state.inflight)]
            # the error reaches whoever awaits the op (and the launcher's summary); one nobody awaits is
            # reported at exit (watchdog.failed), so a warning here would print the same text a third time
            _log.info("%s", exc)

    def pending(self) -> list[PendingOp]:
        """The ops issued on this communicator and not finished yet, oldest first, with the ranks each
        is waiting for (communicator ranks; ``None`` while queued behind earlier ops)."""
        now = time.monotonic()
        return sorted((pending_op(w, now) for w in list(self._state.inflight)), key=lambda p: -p.age_s)

    def recent(self) -> list[str]:
        """The flight recorder: the last finished ops (``AIOCCL_FLIGHT_RECORDER`` of them), oldest first."""
        return self._state.recorder.lines()
