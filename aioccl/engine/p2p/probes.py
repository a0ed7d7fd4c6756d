"""Probing: learning an incoming message's size, type, source and tag before receiving it (MPI's
``MPI_Probe``), so an app can allocate the right buffer for a message whose size it cannot know.

A probe is posted like a receive but takes nothing: it is answered by the earliest waiting message
that fits, or else by the next message that arrives with no receive posted for it (one a posted
receive takes was never the app's to probe). Every probe that fits one message is answered by it;
the message stays for the receive that follows.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ...dtypes import dtype_from_code
from ...errors import PeerLost
from ...transport.frames import RTS, Header

if TYPE_CHECKING:
    from ...work import Work


class Message(NamedTuple):
    """What a probe found: the message's sender (a rank of the communicator), its tag, its dtype and
    element count (``np.empty(m.size, m.dtype)`` is the buffer that receives it), and its size in bytes."""

    source: int
    tag: int
    dtype: np.dtype[Any]
    size: int
    nbytes: int


class Probe:
    __slots__ = ("ctx", "src", "tag", "ranks", "work", "timer")

    def __init__(self, ctx: int, src: int, tag: int, ranks: tuple[int, ...], work: Work[Message]) -> None:
        self.ctx, self.src, self.tag, self.ranks, self.work = ctx, src, tag, ranks, work
        self.timer: asyncio.TimerHandle | None = None

    def fits(self, peer: int, ctx: int, tag: int) -> bool:
        return ctx == self.ctx and (self.src < 0 or self.src == peer) and (self.tag < 0 or self.tag == tag)

    def gone(self, lost: dict[int, PeerLost], closed: set[int]) -> PeerLost | None:
        """Why no message can come any more, if none can."""
        if self.src >= 0:
            return lost.get(self.src)
        others = [r for r in self.ranks if r >= 0]
        crashed = next((lost[r] for r in others if r in lost and r not in closed), None)
        if crashed is not None or not others or not all(r in lost for r in others):
            return crashed
        return lost[others[-1]]

    def answer(self, peer: int, h: Header) -> None:
        nbytes = h.count if h.kind == RTS else h.nbytes  # a ready-to-send carries the payload's size in count
        dt = dtype_from_code(h.dtype) or np.dtype(np.uint8)
        if self.timer is not None:
            self.timer.cancel()
        if self.work._start():
            self.work._set_result(Message(self.ranks.index(peer), h.seq, dt, nbytes // max(dt.itemsize, 1), nbytes))


class Probes:
    """The probes waiting on one engine, answered from the mailbox's reader path (engine thread)."""

    def __init__(self) -> None:
        self.waiting: list[Probe] = []

    def __bool__(self) -> bool:
        return bool(self.waiting)

    def arrived(self, peer: int, h: Header) -> None:
        """A point-to-point message (or ready-to-send) that no posted receive took."""
        for p in [p for p in self.waiting if p.fits(peer, h.ctx, h.seq)]:
            self.waiting.remove(p)
            p.answer(peer, h)

    def on_lost(self, peer: int, lost: dict[int, PeerLost], closed: set[int]) -> None:
        """As a receive's: a probe of ``peer`` fails; one from any source when a rank of it crashed, or
        when every other rank is gone (a rank that closed finished its sends first)."""
        for p in [p for p in self.waiting if p.gone(lost, closed) is not None]:
            self.waiting.remove(p)
            if p.timer is not None:
                p.timer.cancel()
            if p.work._start():
                p.work._set_exception(lost[peer])

    def fail_all(self, exc: BaseException) -> None:
        for p in self.waiting:
            if p.timer is not None:
                p.timer.cancel()
            if p.work._start() or not p.work.done():
                p.work._set_exception(exc)
        self.waiting.clear()

    def withdraw(self, p: Probe) -> None:
        if p in self.waiting:
            self.waiting.remove(p)
            if p.timer is not None:
                p.timer.cancel()
