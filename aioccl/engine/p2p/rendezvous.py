"""Large point-to-point messages by rendezvous, so a receiver's memory stays bounded.

A message up to ``AIOCCL_P2P_EAGER`` bytes (1 MiB) goes at once (eager):
if its receive is not posted yet, it waits in a pooled buffer. A larger one
would let a fast sender fill a slow receiver's memory without limit (300
unexpected 4 MiB sends are 1.2 GB), and would stall the stream behind it:
so the sender sends only a *ready-to-send* (RTS: tag, size, an id), which
queues in the receiver's matching order like any message, and the data
follows once the receiver has posted a receive for it and answered
*clear-to-send* (CTS). The data then lands straight in the posted buffer.
Until then the sender waits, under its op's deadline; a lost peer fails it.

Between two ranks on one host that may read each other's memory, the RTS
also carries an *offer* and the receiver reads the data in place, answering
RDONE instead of CTS (``offers.py``: the offer, and the handshake that keeps
a read from overlapping a sender that has given up).

A collective's large message to such a peer goes the same way (``send_offered``):
its header (fingerprint and all) comes as a COFFER frame whose payload is the
offer, and it is matched like any collective frame; the receiver reads the
data in place (one copy instead of two through the pair's FIFO).

This module keeps both sides' state; the mailbox routes the frames here.
"""

from __future__ import annotations

import asyncio
import os
import struct
from collections.abc import Callable, Mapping

from ...envvars import env_int
from ...errors import AiocclError, PeerLost
from ...transport.cma import PeerMemory
from ...transport.frames import CTS, RDATA, RDONE, RTS, Header
from ..receives import Posted
from .offers import DECLINED, OFFER, READ, Taker

SEND_DATA, WAS_READ, WAS_DECLINED = 0, 1, 2  # a sender's answer: CTS, RDONE (read in place), RDONE (declined)
DEFAULT_EAGER = 1 << 20
DEFAULT_UNEXPECTED = 64 << 20
# a collective message this large to a peer that can read our memory goes as an offer. Below it the FIFO's two
# copies beat the offer's round trip: rail's 1 MiB all_reduce on 2x2 namespace hosts took 1.51 ms with offers
# from 256 KiB and 1.20 ms from 1 MiB; 16 and 64 MiB unchanged (docs/benchmarks.md, "Several hosts")
OFFER_MIN = 1 << 20
OFFER_TAIL = struct.Struct("<iq")  # after a COFFER's offer: its id (for RDONE / CTS) and the data's bytes


def eager_limit(env: Mapping[str, str] = os.environ) -> int:
    """``AIOCCL_P2P_EAGER``: the largest point-to-point payload sent without a rendezvous."""
    return env_int(env, "AIOCCL_P2P_EAGER", DEFAULT_EAGER, 0, 1 << 30)


def unexpected_budget(env: Mapping[str, str] = os.environ) -> int:
    """``AIOCCL_UNEXPECTED_BYTES``: per peer, the bytes of frames held before their receive is posted
    (eager sends, collective frames of a rank running ahead); past it, that peer's sends wait."""
    return env_int(env, "AIOCCL_UNEXPECTED_BYTES", DEFAULT_UNEXPECTED, 1 << 20, 1 << 40)


def rts(ctx: int, tag: int, dtype: int, nbytes: int, rid: int, offer: int = 0) -> bytes:
    """The header of a ready-to-send; ``offer``: the bytes of its offer payload (0: none)."""
    return Header(RTS, 0, dtype, rid, ctx, tag, offer, nbytes).pack()


def data(ctx: int, tag: int, dtype: int, nbytes: int, rid: int) -> bytes:
    return Header(RDATA, 0, dtype, rid, ctx, tag, nbytes).pack()


WITHDRAWN_WAIT_S = 0.1  # how long a receive whose offer was withdrawn waits for its sender's last words


class Rendezvous:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._next = 0
        # sender: (peer, id) -> its answer (SEND_DATA, WAS_READ or WAS_DECLINED)
        self.cts_waiters: dict[tuple[int, int], asyncio.Future[int]] = {}
        self.matched: dict[tuple[int, int], Posted | None] = {}  # receiver: (peer, id) -> where its data goes
        # engine hooks: send a CTS frame to a world rank; the reader of a world rank's memory (or None)
        self.send_control: Callable[[int, bytes], None] | None = None
        self.memory_of: Callable[[int], PeerMemory | None] = lambda peer: None
        # the mailbox's: how a peer's failure reads, naming the rank this rank lost first (Mailbox.peer_lost)
        self.peer_lost: Callable[[int, str], PeerLost] = PeerLost
        self.lost_of: Callable[[int], PeerLost | None] = lambda peer: None  # the mailbox's: a peer's loss, if lost
        self._taker = Taker()
        self.read_in_place = 0  # messages this rank received by reading the sender's memory

    # -- sender side ---------------------------------------------------------------
    def expect_cts(self, peer: int) -> tuple[int, asyncio.Future[int]]:
        """A fresh id for a message to ``peer``, and the future its clear-to-send completes."""
        self._next = (self._next + 1) & 0x7FFFFFFF
        fut = self.cts_waiters[(peer, self._next)] = self.loop.create_future()
        return self._next, fut

    def forget(self, peer: int, rid: int) -> None:
        self.cts_waiters.pop((peer, rid), None)

    def on_cts(self, peer: int, h: Header) -> None:
        fut = self.cts_waiters.pop((peer, h.k), None)
        if fut is not None and not fut.done():
            fut.set_result(SEND_DATA if h.kind == CTS else WAS_READ if h.count else WAS_DECLINED)

    # -- receiver side -------------------------------------------------------------
    def match(self, peer: int, h: Header, p: Posted, lost: PeerLost | None, offer: bytes = b"") -> None:
        """An RTS met its receive: read its data in place if it came with an ``offer`` this rank can
        take, else ask for the data (or, if the two do not match, take it to discard)."""
        if lost is not None:
            p.fail(lost)
            return
        err = p.mismatch(peer, h._replace(nbytes=h.count))
        if err is not None:
            p.fail(err)
        elif len(offer) == OFFER.size and self._read(peer, h, p, offer):
            return
        self.clear(peer, h, None if err is not None else p)

    def _read(self, peer: int, h: Header, p: Posted, offer: bytes) -> bool:
        """The in-place read; False to fall back to CTS and data (the kernel refused)."""
        mem = self.memory_of(peer)
        if mem is None or not len(p.target):
            return False
        outcome = self._taker.take(mem, offer, p.target)
        if outcome == READ:
            self.read_in_place += 1
            p.complete()
        elif outcome == DECLINED:
            self._fail_withdrawn(peer, p, f"it withdrew its message (tag {h.seq}, {h.count} bytes) before it was "
                                          "read: its send passed its deadline, or it aborted", WITHDRAWN_WAIT_S)
        else:
            return False
        if self.send_control is not None:
            self.send_control(peer, Header(RDONE, 0, 0, h.k, h.ctx, h.seq, 0, int(outcome == READ)).pack())
        return True

    def _fail_withdrawn(self, peer: int, p: Posted, detail: str, within: float) -> None:
        """Fail a receive whose sender withdrew its offer. A sender that aborted ends its connection a moment
        later, with last words naming the rank it had lost first: that loss is the receive's error when it comes
        within ``within`` seconds (as a send that finds its connection gone waits for its reader's verdict,
        engine.py); else the withdrawal's own words (a send past its deadline: the connection stays)."""
        lost = self.lost_of(peer)
        if lost is not None or within <= 0:
            p.fail(lost if lost is not None else AiocclError(f"rank {peer} {self.peer_lost(peer, detail).detail}"))
            return
        self.loop.call_later(0.002, self._fail_withdrawn, peer, p, detail, within - 0.002)

    def match_offer(self, peer: int, h: Header, p: Posted, lost: PeerLost | None, payload: bytes) -> None:
        """A collective's offer (COFFER) met its receive: read it in place, or clear it to send."""
        if len(payload) != OFFER.size + OFFER_TAIL.size:
            p.fail(AiocclError(f"rank {peer} sent a corrupt offer for collective seq {h.seq}"))
            return
        rid, nbytes = OFFER_TAIL.unpack_from(payload, OFFER.size)
        self.match(peer, h._replace(k=rid, nbytes=nbytes, count=nbytes), p, lost, payload[:OFFER.size])

    def clear(self, peer: int, h: Header, p: Posted | None) -> None:
        """Receive ``h``'s data into ``p`` (None: discard it, the receive failed) and tell the sender."""
        self.matched[(peer, h.k)] = p
        if self.send_control is not None:
            self.send_control(peer, Header(CTS, 0, 0, h.k, h.ctx, h.seq, 0).pack())

    def on_data(self, peer: int, h: Header) -> Posted | None:
        p = self.matched.pop((peer, h.k), None)
        return p if p is not None and not p.fut.done() else None

    def withdraw(self, fut: asyncio.Future[None]) -> None:
        for key, p in list(self.matched.items()):
            if p is not None and p.fut is fut:
                del self.matched[key]  # its data, should it come, finds no receive and is discarded

    def on_lost(self, peer: int, lost: PeerLost) -> None:
        for key in [k for k in self.cts_waiters if k[0] == peer]:
            fut = self.cts_waiters.pop(key)
            if not fut.done():
                fut.set_exception(lost)
                fut.exception()  # its send may have timed out already: no "never retrieved"
        for key in [k for k in self.matched if k[0] == peer]:
            p = self.matched.pop(key)
            if p is not None:
                p.fail(lost)
