"""Nothing pending goes unnoticed: a watchdog for ops that wait long, a report for ops never finished.

*Watchdog* (torch's NCCL watchdog, NCCL's RAS): every engine checks its communicators' in-flight ops
a few times per ``AIOCCL_WATCHDOG_S`` (10 s); an op that has waited that long is logged with its
sequence number, its communicator and the ranks it waits for, and again every interval while it
still waits. A deadlock (two ranks that both receive first) is then visible at once, not only at the
deadline. ``AIOCCL_WATCHDOG_S=0`` turns it off.

*Hang dump* (``AIOCCL_HANG_DUMP``, a folder; the hang hunter sets it): when an op is first logged, its rank
also writes what a hang's post-mortem needs and a log line cannot hold: every pending op, the flight recorder
and each thread's Python stack, to ``rank<r>-pid<p>.txt`` there.

*Exit report*: an op still pending when its event loop shuts down, or when the process exits, was
never awaited to its end (a forgotten ``await``): its output is partial. Like a never-awaited
coroutine, it is reported with a ``RuntimeWarning`` naming the op, never dropped in silence.
"""

from __future__ import annotations

import asyncio
import atexit
import faulthandler
import os
import socket
import sys
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from . import log
from .engine.view import CommView
from .envvars import env_float
from .errors import PeerLost
from .introspection import FlightRecorder, pending_op
from .work import TOLD, Work


class Watched(Protocol):
    """What the watchdog reads of a communicator it watches: its state (``state.CommState``; it never names
    ``Communicator``: the engine, which keeps the watchdog, sits below the communicator)."""

    view: CommView
    inflight: set[Work[Any]]
    recorder: FlightRecorder

    @property
    def rank(self) -> int: ...


_HOST = socket.gethostname()
_log = log.get("COLL")
DEFAULT_WATCHDOG_S = 10.0


def watchdog_seconds(env: Mapping[str, str]) -> float:
    """``AIOCCL_WATCHDOG_S``: seconds an op waits before it is logged (0: never)."""
    return env_float(env, "AIOCCL_WATCHDOG_S", DEFAULT_WATCHDOG_S, low=0, unit="seconds")


def hang_dump_folder(env: Mapping[str, str]) -> str | None:
    """``AIOCCL_HANG_DUMP``: the folder a rank writes its hang dump into (None: no dump)."""
    return env.get("AIOCCL_HANG_DUMP", "").strip() or None


class Watchdog:
    """One per engine, on its loop: a timer that looks at the in-flight ops of the engine's communicators."""

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float, dump: str | None = None,
                 links: Callable[[], list[str]] | None = None) -> None:
        self.loop = loop
        self.interval = interval
        self.dump = dump
        self.links = links  # the engine's transport state, for the hang dump
        self.comms: weakref.WeakSet[Watched] = weakref.WeakSet()
        self._timer: asyncio.TimerHandle | None = None
        self.reported = 0  # log lines written (tests read it)

    def watch(self, comm: Watched) -> None:
        self.comms.add(comm)
        if self.interval > 0 and self._timer is None and not self.loop.is_closed():
            self._timer = self.loop.call_later(self.interval / 4, self._tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        now = time.monotonic()
        for comm in list(self.comms):
            for w in list(comm.inflight):
                age = now - w._t0
                if age < max(self.interval, w._next_warn):
                    continue
                first = w._next_warn == 0
                w._next_warn = age + self.interval
                p = pending_op(w, now)
                state = "queued behind earlier ops" if p.waiting_for is None else f"waiting for ranks {p.waiting_for}"
                # who is waiting, in the line itself: without AIOCCL_DEBUG's prefix, under torchrun (whose
                # output carries no rank), this is the only way to tell which rank's op it is
                _log.warning("rank %d on %s: %s seq %d on comm %x (%s) has waited %.0f s, %s", comm.rank, _HOST,
                             p.op, p.seq, comm.view.ctx, p.detail, age, state)
                self.reported += 1
                if first and self.dump is not None:
                    self._write_dump(comm, now)
        self._timer = self.loop.call_later(self.interval / 4, self._tick)

    def _write_dump(self, comm: Watched, now: float) -> None:
        """The hang dump of one communicator (module docstring); appended, so a later op's dump adds to it."""
        path = os.path.join(self.dump or ".", f"rank{comm.rank}-pid{os.getpid()}.txt")
        try:
            os.makedirs(self.dump or ".", exist_ok=True)
            with open(path, "a") as f:
                f.write(f"== rank {comm.rank} on {_HOST}, pid {os.getpid()}, comm {comm.view.ctx:x}, "
                        f"{time.strftime('%H:%M:%S')}\npending:\n")
                f.writelines(f"  {pending_op(w, now)}\n" for w in sorted(comm.inflight, key=lambda w: w._t0))
                f.write("flight recorder (oldest first):\n")
                f.writelines(f"  {line}\n" for line in comm.recorder.lines())
                f.write("links (the engine's, now):\n")
                try:
                    f.writelines(f"  {line}\n" for line in (self.links() if self.links is not None else []))
                except Exception as e:  # noqa: BLE001  (a dump must not fail the watchdog's tick)
                    f.write(f"  (could not describe: {e!r})\n")
                f.write("threads:\n")
                f.flush()
                faulthandler.dump_traceback(f, all_threads=True)
        except OSError as e:
            _log.warning("could not write the hang dump %s: %s", path, e)


# ops issued and not finished, and failed ops (the last few) whose error nobody has looked at yet, each with
# the line it was issued from: strong references, so a communicator that nothing else keeps alive is still
# reported at exit
pending: set[Any] = set()
failed: deque[tuple[Any, tuple[Any, int] | None]] = deque(maxlen=64)
# where each op in flight was issued from (the first frame outside aioccl): the exit report points there
origin: dict[Any, tuple[Any, int] | None] = {}
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def issued_from() -> tuple[Any, int] | None:
    """Where the app issued the op being tracked now: the first frame outside the aioccl package, as its code
    and last instruction (its line is worked out only when a warning needs it: ``line_of``; asking a frame
    its line number costs more than an op). Paid only by ops that go on in flight."""
    f: Any = sys._getframe(2)
    while f is not None and f.f_code.co_filename.startswith(_PACKAGE):
        f = f.f_back
    return (f.f_code, f.f_lasti) if f is not None else None


def line_of(where: tuple[Any, int]) -> tuple[str, int]:
    """The file and line of ``issued_from``'s answer."""
    code, lasti = where
    line = next((ln for start, end, ln in code.co_lines() if start <= lasti < end and ln is not None),
                code.co_firstlineno)
    return code.co_filename, line


def already_told(exc: BaseException | None) -> bool:
    """Whether the app was given this failure already through another op (``work.TOLD``): the same error, the
    same text, or the loss of the same rank. Its other ops' failures are then not reported again at exit."""
    for t in TOLD:
        if t is exc or (type(t) is type(exc) and str(t) == str(exc)):
            return True
        if isinstance(t, PeerLost) and isinstance(exc, PeerLost) and t.rank == exc.rank:
            return True
    return False


def report_unfinished(w: Any, why: str, now: float | None = None) -> None:
    p = pending_op(w, time.monotonic() if now is None else now)
    msg = (f"{p.op} seq {p.seq} ({p.detail}) never finished: {why} {p.age_s:.3g} s after it was issued, so "
           "its output is partial. Await every op (or `await comm.close()`) before the end")
    where = origin.get(w)
    if where is not None:  # the app's line that issued it
        warnings.warn_explicit(msg, RuntimeWarning, *line_of(where))
    else:
        warnings.warn(msg, RuntimeWarning, stacklevel=2)


@atexit.register
def _at_exit() -> None:
    now = time.monotonic()
    for w in list(pending):
        if not w.done():
            report_unfinished(w, "the process exited", now)
    said: set[tuple[str, tuple[str, int] | None]] = set()
    for w, issued in list(failed):
        if w._retrieved or already_told(w._exc):
            continue
        p = pending_op(w, now)
        text = f"{p.op} seq {p.seq} ({p.detail}) failed and nobody awaited it: {w._exc}"
        where = line_of(issued) if issued is not None else None
        if (text, where) in said:  # (once, though it was recorded twice)
            continue
        said.add((text, where))
        if where is not None:  # the app's line that issued it, not this file's
            warnings.warn_explicit(text, RuntimeWarning, *where)
        else:
            warnings.warn(text, RuntimeWarning, stacklevel=1)
