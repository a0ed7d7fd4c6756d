"""The two records of a receive: a ``Posted`` receive waiting for its frame, and an ``Early`` frame
waiting for its receive (held in a pooled buffer, copied once the receive is posted).

Either way a frame is checked against what the receiver expects (op, dtype, size) before a byte is
copied, so a mismatched frame fails the receive instead of filling it with the wrong data.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from ..errors import CollectiveMismatch
from ..transport.frames import Header
from ..work import Work
from .notices import amount, describe
from .pool import BufferPool


class Status(NamedTuple):
    """Where the message a receive got came from (``work.status``, like ``MPI_Status``): its sender's rank in
    the communicator, and its tag. A receive from ``ANY_SOURCE`` or with ``ANY_TAG`` learns them on a match."""

    source: int
    tag: int


class Posted:
    """A posted receive. A point-to-point one has its posting number (``order``: which of two receives that fit
    a message came first); one from any source or with any tag has ``src`` / ``tag`` -1 there, and ``ranks``,
    its communicator's world ranks with this rank's as -1 (``status`` reports the sender's rank in it; the
    others are who may send it)."""

    __slots__ = ("target", "fut", "op", "dtype", "what", "work", "order", "src", "tag", "ranks")

    def __init__(self, target: memoryview, fut: asyncio.Future[None], op: int, dtype: int,
                 what: str, work: Work[Any] | None) -> None:
        self.target, self.fut, self.op, self.dtype, self.what, self.work = target, fut, op, dtype, what, work
        self.order, self.src, self.tag = 0, -1, -1
        self.ranks: tuple[int, ...] = ()

    def fits(self, peer: int, tag: int) -> bool:
        return (self.src < 0 or self.src == peer) and (self.tag < 0 or self.tag == tag)

    def matched(self, peer: int, tag: int) -> None:
        """A wildcard receive met its message: the work reports whose it is (before it completes)."""
        if self.work is not None:
            self.work.status = Status(self.ranks.index(peer), tag)

    def mismatch(self, peer: int, h: Header) -> CollectiveMismatch | None:
        if h.nbytes == len(self.target) and h.op == self.op and (h.dtype == self.dtype or not h.nbytes):
            return None
        if not h.op and not self.op:  # a message: what came, and the receive this rank posted
            return CollectiveMismatch(f"{self.what}: rank {peer} sent {amount(h.dtype, h.nbytes)}, this rank "
                                      f"expected recv of {amount(self.dtype, len(self.target))}")
        return CollectiveMismatch(f"{self.what}: rank {peer} sent {describe(h.op, h.dtype, h.nbytes)}, "
                                  f"this rank expected {describe(self.op, self.dtype, len(self.target))}")

    def complete(self) -> None:
        if not self.fut.done():
            self.fut.set_result(None)

    def fail(self, exc: BaseException) -> None:
        if not self.fut.done():
            self.fut.set_exception(exc)
            self.fut.exception()  # its op may have failed already and never await it: no "never retrieved"


COPY_PIECE = 1 << 20  # bytes of an early frame copied into its receive per loop turn


class Early:
    """A frame that arrived before its receive was posted; its bytes count against the sender's budget
    (``Budget``) until they are delivered or dropped."""

    __slots__ = ("peer", "header", "buf", "done", "waiter", "pool", "budget", "rts", "order", "charged")

    def __init__(self, peer: int, header: Header, pool: BufferPool, budget: Budget,
                 rts: Callable[[Posted, bytes], None] | None = None) -> None:
        self.peer, self.header, self.pool, self.budget = peer, header, pool, budget
        self.buf = pool.acquire(header.nbytes)
        self.done = False
        self.waiter: Posted | None = None
        self.rts = rts  # a ready-to-send: handed its receive and its payload (the offer, if any) instead
        self.order = 0  # a point-to-point message's arrival number: a wildcard receive takes the earliest
        self.charged = True  # its bytes count against the sender's budget
        budget.hold(peer, header.nbytes)

    def view(self) -> memoryview:
        return self.buf.data[: self.header.nbytes]

    def finish(self) -> None:
        self.done = True
        if self.waiter is not None:
            self.deliver(self.waiter)

    def deliver(self, p: Posted) -> None:
        if self.rts is not None:
            offer = bytes(self.view())
            self.free()
            self.rts(p, offer)
            return
        err = p.mismatch(self.peer, self.header)
        if err is not None:
            p.fail(err)
        elif self.header.nbytes > COPY_PIECE:
            self._copy_out(p, 0)  # a large frame: a piece now, the rest on later turns of the loop
            return
        else:
            p.target[:] = self.view()
            p.complete()
        self.free()

    def _copy_out(self, p: Posted, at: int) -> None:
        """Copy from ``at`` on into ``p``'s buffer a piece per loop turn, so a 16 MiB frame that came before
        its receive does not hold the loop for the milliseconds of its copy; then complete ``p``."""
        end = min(at + COPY_PIECE, self.header.nbytes)
        if not p.fut.done():  # a receive failed meanwhile (its op's deadline, an abort) takes no more
            p.target[at:end] = self.view()[at:end]
            if end < self.header.nbytes:
                p.fut.get_loop().call_soon(self._copy_out, p, end)
                return
            p.complete()
        self.free()

    def expected(self, p: Posted) -> None:
        """Its receive ``p`` is posted while the frame still arrives: its bytes are no longer unexpected, so off
        the sender's budget now. Held until delivered, they could pause reading from the sender with the frame
        half read, and it would never finish (two back-to-back 64 MiB broadcasts over sockets hung so)."""
        self.waiter = p
        self._uncharge()

    def free(self) -> None:
        """Its bytes are no longer needed: back to the pool, off the sender's budget."""
        self.pool.release(self.buf)
        self._uncharge()

    def drop(self) -> None:
        """Its connection ended mid-frame: off the budget (the buffer is left to the collector)."""
        self._uncharge()

    def _uncharge(self) -> None:
        if self.charged:
            self.charged = False
            self.budget.release(self.peer, self.header.nbytes)


class Budget:
    """Per peer, the bytes of frames that arrived before their receive was posted (``AIOCCL_UNEXPECTED_BYTES``).

    Past the budget the engine stops reading from that peer (``pause``), so its sender blocks in the
    transport (a full TCP window, a full ring) instead of this rank's memory growing; below half of it,
    reading resumes. Receives posted here consume what was held, so a program whose receives match its
    sends in order never stalls; one that needs a later message from a paused peer first waits on it
    until its deadline, which names that peer.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held: dict[int, int] = {}
        self.paused: set[int] = set()
        self.pause: Callable[[int, bool], None] | None = None  # the engine's: (peer, paused)

    def hold(self, peer: int, nbytes: int) -> None:
        held = self.held[peer] = self.held.get(peer, 0) + nbytes
        if held > self.limit and peer not in self.paused:
            self.paused.add(peer)
            if self.pause is not None:
                self.pause(peer, True)

    def release(self, peer: int, nbytes: int) -> None:
        held = self.held[peer] = max(0, self.held.get(peer, 0) - nbytes)
        if peer in self.paused and held <= self.limit // 2:
            self.paused.discard(peer)
            if self.pause is not None:
                self.pause(peer, False)


def drop_unfinished(early: dict[tuple[int, int, int, int], Early],
                    p2p_early: dict[tuple[int, int, int], deque[Early]], peer: int) -> None:
    """``peer``'s connection ended: its frames still arriving are dropped (off its budget); those that
    fully arrived before the end stay for their receives."""
    for key in [k for k, e in early.items() if k[0] == peer and not e.done]:
        early.pop(key).drop()
    for key3 in [k for k in p2p_early if k[0] == peer]:
        for e in p2p_early[key3]:
            if not e.done:
                e.drop()
        p2p_early[key3] = deque(e for e in p2p_early[key3] if e.done)
