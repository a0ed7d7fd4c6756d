"""The ib transport's protocol, as pure state machines (no verbs, no loop, no clock).

A connection is one RC queue pair per peer pair. Each side owns a *FIFO* of
``nslots`` receive slots of ``slot`` bytes, registered for remote write; the
peer learns its address and key at setup. A frame (the 48-byte header of
``..frames`` and its payload) travels as one or more *chunks*, one RDMA
WRITE WITH IMMEDIATE each, into consecutive slots: the first chunk carries the
header and the start of the payload, the rest carry payload only. The
immediate is the chunk's number (mod 2**32): the receiver hands chunks on in
that order even if their completions arrive out of order, and a number that
it has seen or cannot have been sent is a protocol error.

Flow control is by credits, as in NCCL: the sender may have at most
``nslots`` chunks that the receiver has not freed. The receiver frees a slot
once its bytes are copied out, and returns the *cumulative* count of freed
slots in a small SEND (so a late or repeated credit message is harmless).
Every WRITE WITH IMMEDIATE and every SEND consumes one posted receive, so each
side keeps ``recv_depth(nslots)`` receives posted and re-posts each one as it
completes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from ..frames import HEADER_SIZE, Header, unpack

MASK32 = (1 << 32) - 1
CREDIT = struct.Struct("<Q")  # a credit message: slots freed so far, cumulative

# wr_id = conn << 24 | kind << 20 | index: one CQ serves every connection of a device
KIND_WRITE, KIND_CREDIT_SEND, KIND_RECV = 1, 2, 3


def wr_id(conn: int, kind: int, index: int) -> int:
    return (conn << 24) | (kind << 20) | index


def split_wr_id(w: int) -> tuple[int, int, int]:
    return w >> 24, (w >> 20) & 0xF, w & 0xFFFFF


def recv_depth(nslots: int) -> int:
    """Receives to keep posted: the peer's writes in flight (at most ``nslots``, by credits) and its
    credit messages in flight (each frees at least one of my ``nslots`` writes)."""
    return 2 * nslots + 2


def send_depth(nslots: int) -> int:
    return 2 * nslots + 2


def chunk_plan(nbytes: int, slot: int) -> list[tuple[int, int]]:
    """(payload offset, payload bytes) of each chunk of a frame with ``nbytes`` of payload."""
    first = min(nbytes, slot - HEADER_SIZE)
    plan = [(0, first)]
    off = first
    while off < nbytes:
        n = min(slot, nbytes - off)
        plan.append((off, n))
        off += n
    return plan


class ProtocolError(Exception):
    """The peer broke the protocol (or memory was corrupted): the connection cannot go on."""


class SendWindow:
    """The sender's side: which slot the next chunk goes to, and whether it may go yet.

    A chunk may go when the peer has a free slot (a credit) *and* my staging
    slot of the same index is free again (its WRITE completed locally).
    """

    def __init__(self, nslots: int) -> None:
        self.nslots = nslots
        self.sent = 0  # chunks written so far
        self.freed = 0  # the peer's cumulative count of slots freed
        self._busy = [False] * nslots  # my staging slot i holds a write not yet completed

    def ready(self) -> bool:
        return self.sent - self.freed < self.nslots and not self._busy[self.sent % self.nslots]

    def take(self) -> tuple[int, int]:
        """(slot, immediate) for the next chunk; call only when ``ready()``."""
        assert self.ready()
        slot, imm = self.sent % self.nslots, self.sent & MASK32
        self._busy[slot] = True
        self.sent += 1
        return slot, imm

    def on_credit(self, freed: int) -> None:
        if freed > self.sent:
            raise ProtocolError(f"peer freed {freed} slots but only {self.sent} were written")
        self.freed = max(self.freed, freed)

    def on_write_done(self, slot: int) -> None:
        if not self._busy[slot]:
            raise ProtocolError(f"completion for staging slot {slot}, which had no write")
        self._busy[slot] = False

    def idle(self) -> bool:
        return not any(self._busy)


class RecvWindow:
    """The receiver's side: chunk completions in, slots in chunk order out, credits back."""

    def __init__(self, nslots: int) -> None:
        self.nslots = nslots
        self.next = 0  # the chunk number to hand on next
        self.freed = 0  # slots freed (copied out) so far
        self.reported = 0  # the last cumulative count sent back
        self._early: dict[int, int] = {}  # chunk number -> byte_len, arrived before its turn

    def on_write(self, imm: int, nbytes: int) -> list[tuple[int, int]]:
        """A WRITE WITH IMMEDIATE landed; returns the (slot, nbytes) now due, in chunk order."""
        ahead = (imm - self.next) & MASK32
        if ahead >= self.nslots or ahead in self._early:
            raise ProtocolError(f"chunk {imm} is not expected (next is {self.next & MASK32}, "
                                f"{self.nslots} slots)")
        if (self.next + ahead) - self.freed >= self.nslots:
            raise ProtocolError(f"chunk {imm} overran the FIFO: the sender ignored its credits")
        self._early[ahead] = nbytes
        due: list[tuple[int, int]] = []
        while 0 in self._early:
            due.append((self.next % self.nslots, self._early.pop(0)))
            self.next += 1
            self._early = {k - 1: v for k, v in self._early.items()}
        return due

    def release(self, n: int = 1) -> None:
        self.freed += n
        assert self.freed <= self.next

    def credit_due(self) -> int | None:
        """The cumulative count to send back, if there is news."""
        if self.freed == self.reported:
            return None
        self.reported = self.freed
        return self.freed


class Reassembler:
    """Turns the chunk stream back into frames, copying each payload straight to where the sink says.

    ``on_header(header) -> (target, done)`` is asked once per frame, as the
    socket reader asks it; ``done()`` follows once the payload is all in.
    """

    def __init__(self, on_header: Callable[[Header], tuple[memoryview, Callable[[], None]]]) -> None:
        self._on_header = on_header
        self._target: memoryview | None = None
        self._done: Callable[[], None] | None = None
        self._got = 0
        self._want = 0

    def feed(self, chunk: memoryview) -> None:
        """One slot's bytes, in chunk order."""
        if self._done is None:  # a new frame
            if len(chunk) < HEADER_SIZE:
                raise ProtocolError(f"a frame's first chunk has {len(chunk)} bytes, less than a header")
            try:
                h = unpack(chunk[:HEADER_SIZE])
            except ValueError as e:
                raise ProtocolError(str(e)) from None
            chunk = chunk[HEADER_SIZE:]
            self._target, self._done = self._on_header(h)
            self._got, self._want = 0, h.nbytes
        n = len(chunk)
        if self._got + n > self._want:
            raise ProtocolError(f"chunk of {n} bytes overruns the frame ({self._want - self._got} left)")
        if n:
            assert self._target is not None
            self._target[self._got:self._got + n] = chunk
            self._got += n
        if self._got == self._want:
            done, self._done, self._target = self._done, None, None
            assert done is not None
            done()

    def mid_frame(self) -> bool:
        return self._done is not None
