"""What a communicator is doing now (:meth:`pending`) and what it did last (the flight recorder).

A hang in a collective library is almost always one rank that issued
something else, or nothing, a few calls back. So every op is described
when it is issued (op, sequence number, count, dtype, root), and the last
:data:`RECORDER_SIZE` finished ops are kept in a bounded ring that a
:class:`~aioccl.errors.CollectiveTimeout` carries in its message and the
log prints. Nothing here is on the data path: a description is one short
string per op, and the ring is a ``deque`` with ``maxlen``.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass

from .work import Work

RECORDER_SIZE = int(os.environ.get("AIOCCL_FLIGHT_RECORDER", "64") or 64)


@dataclass(frozen=True)
class PendingOp:
    """One in-flight op, as :meth:`Communicator.pending` reports it."""

    op: str
    seq: int  # sequence number (collectives) or tag (p2p)
    detail: str  # count, dtype, root, peer
    age_s: float  # seconds since it was issued
    waiting_for: list[int] | None  # communicator ranks it is blocked on; None: queued, not started

    def __str__(self) -> str:
        state = "queued" if self.waiting_for is None else f"waiting for ranks {self.waiting_for}"
        return f"{self.op} seq {self.seq} ({self.detail}), {self.age_s * 1e3:.1f} ms old, {state}"


def pending_op(work: Work, now: float) -> PendingOp:
    probe = work._probe
    waiting: list[int] | None = None
    if probe is not None:
        try:
            found = probe()
            waiting = None if found is None else sorted(found)
        except RuntimeError:  # the engine thread changed it under us: report it as not started
            waiting = None
    return PendingOp(work.op, work.seq, work._desc, now - work._t0, waiting)


class FlightRecorder:
    """The last finished ops of one communicator, oldest first (thread-safe appends)."""

    def __init__(self, size: int = RECORDER_SIZE) -> None:
        self._ring: deque[str] = deque(maxlen=max(1, size))

    def add(self, work: Work) -> None:
        exc = work._exc
        status = "ok" if exc is None else f"{type(exc).__name__}"
        took = (time.monotonic() - work._t0) * 1e3
        self._ring.append(f"{work.op} seq {work.seq} ({work._desc}): {status} in {took:.1f} ms")

    def lines(self) -> list[str]:
        return list(self._ring)
