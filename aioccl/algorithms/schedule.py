"""The vocabulary of sans-io schedules.

A schedule is what one rank does for one collective: a tuple of
``Round`` s over three flat buffers (``IN``, ``OUT``, ``SCRATCH``),
addressed in *elements*. It is pure data: no sockets, no arrays, no loop. The
engine executes it over real transports; ``.reference`` executes the
schedules of all ranks in-process for tests; a simulator can cost it.

Round semantics (the executor's contract):

1. ``copies`` run first, in order;
2. ``sends`` and ``recvs`` then run concurrently;
3. once *all* of them have finished, each ``RecvReduce`` applies
   ``dst = op(src, incoming)`` in order (so a region may be sent and reduced
   into in the same round without a race).

Messages between a pair of ranks are matched by their order: the k-th send
from a to b in a's schedule (rounds in order, ops in listed order) is the
k-th receive from a in b's schedule. Algorithms must list them consistently.
"""

from __future__ import annotations

from dataclasses import dataclass, field

IN, OUT, SCRATCH = 0, 1, 2
BUFFER_NAMES = ("IN", "OUT", "SCRATCH")


@dataclass(frozen=True, slots=True)
class Region:
    buf: int
    start: int
    stop: int

    @property
    def count(self) -> int:
        return self.stop - self.start

    def __repr__(self) -> str:
        return f"{BUFFER_NAMES[self.buf]}[{self.start}:{self.stop}]"


@dataclass(frozen=True, slots=True)
class Send:
    peer: int
    src: Region


@dataclass(frozen=True, slots=True)
class Recv:
    peer: int
    dst: Region


@dataclass(frozen=True, slots=True)
class RecvReduce:
    """Receive into ``tmp`` (scratch), then ``dst = op(src, tmp)``."""

    peer: int
    dst: Region
    src: Region
    tmp: Region


@dataclass(frozen=True, slots=True)
class Copy:
    src: Region
    dst: Region


@dataclass(frozen=True, slots=True)
class Round:
    copies: tuple[Copy, ...] = ()
    sends: tuple[Send, ...] = ()
    recvs: tuple[Recv | RecvReduce, ...] = ()


@dataclass(frozen=True, slots=True)
class Schedule:
    """One rank's part of one collective."""

    rounds: tuple[Round, ...]
    scratch: int = 0  # elements of SCRATCH needed
    scale: tuple[Region, ...] = field(default=())  # regions divided by nranks at the end (avg)
    algo: str = ""

    def peers(self) -> set[int]:
        return {t.peer for r in self.rounds for t in (*r.sends, *r.recvs)}


def split(count: int, parts: int) -> list[tuple[int, int]]:
    """Split ``range(count)`` into ``parts`` contiguous ranges differing by at most one."""
    base, extra = divmod(count, parts)
    out, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def pieces(count: int, piece: int) -> list[tuple[int, int]]:
    """Consecutive ranges of at most ``piece`` elements (one empty range for count 0)."""
    if count == 0:
        return [(0, 0)]
    piece = max(1, piece)
    return [(s, min(s + piece, count)) for s in range(0, count, piece)]
