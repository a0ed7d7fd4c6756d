"""Receives from any source or with any tag (``ANY_SOURCE``, ``ANY_TAG``), matched by MPI's rules.

A specific receive waits in its ``(peer, ctx, tag)`` queue (``mailbox.py``);
a wildcard one waits here, in its communicator's list in posting order.
Both carry a posting number, and the rules follow from it:

- a message goes to the *earliest posted* receive that fits it: the first
  live one of its own queue, or the first wildcard of its context that fits,
  whichever was posted first. A wildcard never takes a message that a
  receive posted before it would take, and no receive overtakes it;
- a wildcard receive posted after messages arrived takes the *earliest
  arrival* that fits (each message has an arrival number), so from any one
  sender messages are taken in the order they were sent.

Messages waiting for their receive never fit a receive still waiting (the
receive would have taken them), which is why neither side looks further.

A receive from any source fails when a rank of its communicator crashes
(as ULFM's ``MPI_ERR_PROC_FAILED_PENDING``: the message may have been that
rank's), and when every other rank has closed; one from a given rank, when
that rank is lost.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator

from ...errors import PeerLost
from ..receives import Early, Posted


class Wildcards:
    """Each communicator's (context's) wildcard receives, in posting order."""

    def __init__(self) -> None:
        self.by_ctx: dict[int, list[Posted]] = {}

    def __bool__(self) -> bool:
        return bool(self.by_ctx)

    def add(self, ctx: int, p: Posted) -> None:
        self.by_ctx.setdefault(ctx, []).append(p)

    def remove(self, ctx: int, p: Posted) -> None:
        waiting = self.by_ctx.get(ctx)
        if waiting and p in waiting:
            waiting.remove(p)
            if not waiting:
                del self.by_ctx[ctx]

    def withdraw(self, ctx: int, fut: asyncio.Future[None]) -> None:
        """A receive that timed out (its future ``fut``) leaves its list."""
        for p in list(self.by_ctx.get(ctx, ())):
            if p.fut is fut:
                self.remove(ctx, p)

    def take(self, peer: int, ctx: int, tag: int, queue: deque[Posted] | None) -> Posted | None:
        """The receive that message (``peer``, ``ctx``, ``tag``) goes to: the earlier posted of the first receive
        in its own ``queue`` and the first wildcard receive that fits; claimed and off its list (None: none)."""
        waiting = self.by_ctx.get(ctx, [])
        while True:
            wild = next((p for p in waiting if p.fits(peer, tag)), None)
            own = queue[0] if queue else None
            if wild is None and own is None:
                return None
            if own is None or (wild is not None and wild.order < own.order):
                assert wild is not None
                self.remove(ctx, wild)
                cand = wild
            else:
                assert queue is not None
                cand = queue.popleft()
            if cand.work is None or cand.work._start():  # else cancelled meanwhile: it steps aside
                if cand is wild:
                    cand.matched(peer, tag)
                return cand

    def on_lost(self, peer: int, lost: dict[int, PeerLost], closed: set[int]) -> Iterator[Posted]:
        """The receives that ``peer``'s loss fails (taken off their lists): from it; and from any source,
        unless it closed gracefully while another rank may still send."""
        for ctx in list(self.by_ctx):
            for p in list(self.by_ctx.get(ctx, ())):
                if p.src == peer or (p.src < 0 and peer in p.ranks and dead_source(p, lost, closed)):
                    self.remove(ctx, p)
                    yield p

    def all(self) -> Iterator[Posted]:
        for waiting in self.by_ctx.values():
            yield from waiting

    def clear(self) -> None:
        self.by_ctx.clear()


def dead_source(p: Posted, lost: dict[int, PeerLost], closed: set[int]) -> PeerLost | None:
    """Why a receive from any source of ``p.ranks`` cannot complete: a rank crashed (lost, and not one of
    ``closed``, which ended gracefully), or all of them are gone; None while one may still send."""
    others = [r for r in p.ranks if r >= 0]
    crashed = next((lost[r] for r in others if r in lost and r not in closed), None)
    if crashed is not None:
        return crashed
    if others and all(r in lost for r in others):
        return lost[others[-1]]
    return None


def earliest(p2p_early: dict[tuple[int, int, int], deque[Early]], ctx: int, src: int,
             tag: int) -> tuple[int, int, int] | None:
    """The key of the earliest-arrived message waiting on ``ctx`` that a receive of (``src``, ``tag``) fits
    (-1: any)."""
    best: tuple[int, int, int] | None = None
    first = 0
    for key, waiting in p2p_early.items():
        fits = waiting and key[1] == ctx and (src < 0 or key[0] == src) and (tag < 0 or key[2] == tag)
        if fits and (best is None or waiting[0].order < first):
            best, first = key, waiting[0].order
    return best
