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

This module keeps both sides' state; the mailbox routes the frames here.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from dataclasses import replace

from ..envvars import env_int
from ..errors import PeerLost
from ..transport.frames import CTS, RDATA, RTS, Header
from .receives import Posted

DEFAULT_EAGER = 1 << 20
DEFAULT_UNEXPECTED = 64 << 20


def eager_limit(env: Mapping[str, str] = os.environ) -> int:
    """``AIOCCL_P2P_EAGER``: the largest point-to-point payload sent without a rendezvous."""
    return env_int(env, "AIOCCL_P2P_EAGER", DEFAULT_EAGER, 0, 1 << 30)


def unexpected_budget(env: Mapping[str, str] = os.environ) -> int:
    """``AIOCCL_UNEXPECTED_BYTES``: per peer, the bytes of frames held before their receive is posted
    (eager sends, collective frames of a rank running ahead); past it, that peer's sends wait."""
    return env_int(env, "AIOCCL_UNEXPECTED_BYTES", DEFAULT_UNEXPECTED, 1 << 20, 1 << 40)


def rts(ctx: int, tag: int, dtype: int, nbytes: int, rid: int) -> bytes:
    return Header(RTS, 0, dtype, rid, ctx, tag, 0, nbytes).pack()


def data(ctx: int, tag: int, dtype: int, nbytes: int, rid: int) -> bytes:
    return Header(RDATA, 0, dtype, rid, ctx, tag, nbytes).pack()


class Rendezvous:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._next = 0
        self.cts_waiters: dict[tuple[int, int], asyncio.Future[None]] = {}  # sender: (peer, id) -> its CTS
        self.matched: dict[tuple[int, int], Posted | None] = {}  # receiver: (peer, id) -> where its data goes
        # engine hook: send a CTS frame to a world rank
        self.send_control: Callable[[int, bytes], None] | None = None

    # -- sender side ---------------------------------------------------------------
    def expect_cts(self, peer: int) -> tuple[int, asyncio.Future[None]]:
        """A fresh id for a message to ``peer``, and the future its clear-to-send completes."""
        self._next = (self._next + 1) & 0x7FFFFFFF
        fut = self.cts_waiters[(peer, self._next)] = self.loop.create_future()
        return self._next, fut

    def forget(self, peer: int, rid: int) -> None:
        self.cts_waiters.pop((peer, rid), None)

    def on_cts(self, peer: int, h: Header) -> None:
        fut = self.cts_waiters.pop((peer, h.k), None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    # -- receiver side -------------------------------------------------------------
    def match(self, peer: int, h: Header, p: Posted, lost: PeerLost | None) -> None:
        """An RTS met its receive: ask for the data (or, if the two do not match, take it to discard)."""
        if lost is not None:
            p.fail(lost)
            return
        err = p.mismatch(peer, replace(h, nbytes=h.count))
        if err is not None:
            p.fail(err)
        self.clear(peer, h, None if err is not None else p)

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
