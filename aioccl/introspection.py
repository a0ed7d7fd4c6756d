"""What a communicator is doing now (``pending()``) and what it did last (the flight recorder).

A hang in a collective library is almost always one rank that issued
something else, or nothing, a few calls back. So every op is described
when it is issued (op, sequence number, count, dtype, root), and the last
``AIOCCL_FLIGHT_RECORDER`` (64) finished ops are kept in a bounded record that a
``CollectiveTimeout`` carries in its message and the
log prints. Nothing here is on the data path: a description is one short
string per op, and the record is a ``deque`` with ``maxlen``.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .envvars import env_int
from .work import Work

RECORDER_SIZE = 64


def recorder_size(env: Mapping[str, str] = os.environ) -> int:
    """``AIOCCL_FLIGHT_RECORDER``, read when a communicator is made (a bad value is an InvalidArgument then,
    not an error at import)."""
    return env_int(env, "AIOCCL_FLIGHT_RECORDER", RECORDER_SIZE, 1)


@dataclass(frozen=True)
class PendingOp:
    """One in-flight op, as ``Communicator.pending()`` reports it."""

    op: str
    seq: int  # sequence number (collectives) or tag (p2p)
    detail: str  # count, dtype, root, peer
    age_s: float  # seconds since it was issued
    waiting_for: list[int] | None  # communicator ranks it is blocked on; None: queued, not started

    def __str__(self) -> str:
        state = "queued" if self.waiting_for is None else f"waiting for ranks {self.waiting_for}"
        return f"{self.op} seq {self.seq} ({self.detail}), {self.age_s * 1e3:.1f} ms old, {state}"


def describe(desc: Any) -> str:
    """An op's ``(count, dtype, reduction or None, root or None)``, formatted only when somebody reads it
    (formatting a numpy dtype costs microseconds: too much to do on every op)."""
    if not isinstance(desc, tuple):
        return str(desc)
    count, dtype, op, root = desc
    return f"{count} x {dtype}" + (f", {op.value}" if op is not None else "") + (
        f", root {root}" if root is not None else "")


def pending_op(work: Work[Any], now: float) -> PendingOp:
    probe = work._probe
    waiting: list[int] | None = None
    if probe is not None:
        try:
            found = probe()
            waiting = None if found is None else sorted(found)
        except RuntimeError:  # the engine thread changed it under us: report it as not started
            waiting = None
    return PendingOp(work.op, work.seq, describe(work._desc), now - work._t0, waiting)


class FlightRecorder:
    """The last finished ops of one communicator, oldest first (thread-safe appends)."""

    def __init__(self, size: int | None = None) -> None:
        size = recorder_size() if size is None else size
        self.entries: deque[tuple[str, int, Any, BaseException | None, float]] = deque(maxlen=max(1, size))

    def add(self, work: Work[Any]) -> None:
        """Called for every op: keeps the raw facts; ``lines()`` formats them."""
        self.entries.append((work.op, work.seq, work._desc, work._exc, time.monotonic() - work._t0))

    def lines(self) -> list[str]:
        return [f"{op} seq {seq} ({describe(desc)}): {'ok' if exc is None else type(exc).__name__} "
                f"in {took * 1e3:.1f} ms" for op, seq, desc, exc, took in list(self.entries)]
