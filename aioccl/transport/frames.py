"""The data-frame header, as pure encode/decode functions.

Every message on a data connection is a 32-byte header followed by
``nbytes`` of payload. The header names the op it belongs to (context,
sequence number or tag, message index) and what it carries (op kind code,
dtype code), so a receiver can match it to a posted receive, or name a
mismatch precisely.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from ..bootstrap.sockio import Closed

# kind, op, dtype, k, ctx, seq_or_tag, nbytes, count, root, redop: the fields of Header, in its order
HEADER = struct.Struct("<BBBIQqQqiB4x")
HEADER_SIZE = HEADER.size  # 48
MAX_FRAME = 1 << 46  # no single message is larger than this; anything bigger is a corrupt header
NOTICE = struct.Struct("<qBBB5xqq")  # a MISMATCH frame's payload: offender rank, its op, dtype, redop, count, root
FAILURE = struct.Struct("<B3xId")  # a FAIL frame's payload starts: cause, number of culprits, seconds (timeouts)
CULPRIT = struct.Struct("<i")  # then that many world ranks, then the reporter's message (UTF-8)
MAX_FAILURE_BYTES = 4096  # a FAIL frame's payload is capped: it is read into a pooled buffer

COLL, P2P, BYE, MISMATCH, FAIL, PROBE = 1, 2, 3, 4, 5, 6
# a large point-to-point message goes by rendezvous: ready-to-send (no payload; count = its bytes, k = its id),
# clear-to-send (the receiver has posted a receive for it), then its data
RTS, CTS, RDATA = 7, 8, 9
# a BYE's op: 0 a graceful close (every op's part done first); BYE_ABORT the sender's last words from abort()
BYE_ABORT = 1
SAID_ABORT = "it called abort() on its communicator (no crash)"  # PeerLost's detail after BYE_ABORT
# the receiver stopped (seq 1) or resumed (seq 0) reading this connection: its budget for unexpected frames is
# spent, so the sender's kernel must not count the closed window as a dead peer
PAUSE = 10
# the receiver read a rendezvous message in place, out of the sender's memory (same host): no data follows
RDONE = 11
# a large collective message to a same-host peer that may read this process's memory: an offer (where the data
# lies) instead of the data; the receiver reads it in place and answers RDONE, or clears it (CTS) for RDATA
COFFER = 12
KIND_NAMES = {COLL: "collective", P2P: "p2p", BYE: "bye", MISMATCH: "mismatch notice", FAIL: "failure notice",
              PROBE: "fingerprint probe", RTS: "ready to send", CTS: "clear to send", RDATA: "rendezvous data",
              PAUSE: "reading paused", RDONE: "read in place", COFFER: "collective offer"}
LOST, TIMEOUT, ABORTED = 1, 2, 3  # a FAIL frame's causes


def pack_failure(cause: int, culprits: list[int], seconds: float, message: str) -> bytes:
    """A FAIL frame's payload: why the reporter gave up an op (its cause, the ranks it blames)."""
    head = FAILURE.pack(cause, len(culprits), seconds) + b"".join(CULPRIT.pack(c) for c in culprits)
    return head + message.encode("utf-8", "replace")[:MAX_FAILURE_BYTES - len(head)]


def unpack_failure(buf: bytes | memoryview) -> tuple[int, list[int], float, str]:
    """Inverse of ``pack_failure()``; ``ValueError`` for a payload that is not one."""
    cause, n, seconds = FAILURE.unpack_from(buf)
    end = FAILURE.size + n * CULPRIT.size
    if cause not in (LOST, TIMEOUT, ABORTED) or end > len(buf):
        raise ValueError("corrupt failure notice")
    culprits = [CULPRIT.unpack_from(buf, FAILURE.size + i * CULPRIT.size)[0] for i in range(n)]
    return cause, culprits, seconds, bytes(buf[end:]).decode("utf-8", "replace")


class Header(NamedTuple):
    """One frame's header. For a collective, (op, dtype, redop, count, root) is its *fingerprint*:
    every frame carries the sender's, so a receiver detects a different call from the first frame.
    (A named tuple: one is built for every frame received, and a frozen dataclass costs microseconds.)"""

    kind: int
    op: int  # collective code (or 0)
    dtype: int  # dtypes.dtype_code (or 0)
    k: int  # index of the message within the op, per (src, dst) pair
    ctx: int  # communicator context id
    seq: int  # collective sequence number, or p2p tag
    nbytes: int
    count: int = 0  # type: ignore[assignment]  # (shadows tuple.count) the op's element count as its caller gave it
    root: int = 0
    redop: int = 0  # ReduceOp.code, 0 for none

    def pack(self) -> bytes:
        return HEADER.pack(*self)

    def fingerprint(self) -> tuple[int, int, int, int, int]:
        return (self.op, self.dtype, self.redop, self.count, self.root)


def pack(kind: int, op: int, dtype: int, k: int, ctx: int, seq: int, nbytes: int, count: int = 0, root: int = 0,
         redop: int = 0) -> bytes:
    """``Header(...).pack()`` without building the header (the per-message hot path)."""
    return HEADER.pack(kind, op, dtype, k, ctx, seq, nbytes, count, root, redop)


def unpack(buf: bytes | bytearray | memoryview, offset: int = 0) -> Header:
    """The header at ``offset`` of ``buf``; ``ValueError`` for one that no sender writes."""
    h: Header = _new_tuple(Header, HEADER.unpack_from(buf, offset))  # the struct's fields are in Header's order
    if h[0] not in KIND_NAMES:
        raise ValueError(f"corrupt frame: unknown kind {h[0]}")
    if not 0 <= h[6] <= MAX_FRAME:
        raise ValueError(f"corrupt frame: {h[6]} payload bytes")
    return h


_new_tuple = tuple.__new__  # a Header from the unpacked fields without the named tuple's Python __new__



def abort_words(lost: int = -1) -> bytes:
    """The frame ``abort()`` leaves as its last words, so the peer can tell an abort from a crash; ``lost`` (its
    ``root``): the world rank whose loss the aborting rank knew of first (-1: none), so that a rank that learns
    of a failure through a third rank names the rank that died, not the one that reported it."""
    return Header(BYE, BYE_ABORT, 0, 0, 0, 0, 0, 0, lost).pack()


def said_abort(lost: int) -> str:
    """PeerLost's detail for a peer whose last words were an abort (``abort_words``)."""
    if lost < 0:
        return SAID_ABORT
    return f"it called abort() after it lost rank {lost} (rank {lost} was lost first; this rank reported it)"


class SaidAbort(Closed):
    """A connection ended by the peer's abort (its last words, ``abort_words``), not by a crash; ``lost_first``:
    the world rank whose loss it knew of first (-1: none)."""

    def __init__(self, lost_first: int) -> None:
        super().__init__(said_abort(lost_first))
        self.lost_first = lost_first
