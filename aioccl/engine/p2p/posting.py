"""Posting point-to-point receives (a mixin of the ``Mailbox``): a specific one into its ``(peer, ctx, tag)``
queue, a wildcard one (``ANY_SOURCE`` / ``ANY_TAG``) into its communicator's list (``wildcards.py``); either
takes a message that arrived first, in MPI's order. Withdrawing one at its deadline, or when cancelled.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...errors import PeerLost
from ...work import Work
from ..receives import Early, Posted
from .wildcards import Wildcards, dead_source, earliest

if TYPE_CHECKING:
    from .rendezvous import Rendezvous


class PointToPointPosting:
    loop: asyncio.AbstractEventLoop
    p2p_posted: dict[tuple[int, int, int], deque[Posted]]
    p2p_early: dict[tuple[int, int, int], deque[Early]]
    wild: Wildcards
    _posts: itertools.count[int]
    lost: dict[int, PeerLost]
    closed_peers: set[int]
    rdv: Rendezvous
    on_post: Callable[[int], None] | None

    if TYPE_CHECKING:
        def _attach(self, e: Early, p: Posted) -> None: ...

    def post_p2p(self, peer: int, ctx: int, tag: int, target: memoryview, dtype: int, what: str,
                 work: Work[Any]) -> asyncio.Future[None] | None:
        """Post a receive; None if ``work`` was cancelled before it could be posted."""
        key = (peer, ctx, tag)
        early = self.p2p_early.get(key)
        if early:
            if not work._start():
                return None
            fut = self.loop.create_future()
            p = Posted(target, fut, 0, dtype, what, work)
            e = early.popleft()
            if not early:
                del self.p2p_early[key]
            self._attach(e, p)
            return fut
        fut = self.loop.create_future()
        p = Posted(target, fut, 0, dtype, what, work)
        if peer in self.lost:
            if work._start():
                p.fail(self.lost[peer])
            return fut
        p.order = next(self._posts)
        self.p2p_posted.setdefault(key, deque()).append(p)
        work._on_cancel = functools.partial(self.loop.call_soon_threadsafe, self._unpost_p2p, key, p)
        if self.on_post is not None:
            self.on_post(peer)  # its message may wait in a FIFO
        return fut

    def post_any(self, src: int, ctx: int, tag: int, ranks: tuple[int, ...], target: memoryview, dtype: int,
                 what: str, work: Work[Any]) -> asyncio.Future[None] | None:
        """Post a receive from ``src`` (a world rank, or -1: any of ``ranks``, this rank's given as -1) with
        ``tag`` (-1: any): it takes the earliest arrival that fits, else waits for one in posting order."""
        fut = self.loop.create_future()
        p = Posted(target, fut, 0, dtype, what, work)
        p.src, p.tag, p.ranks = src, tag, ranks
        key = earliest(self.p2p_early, ctx, src, tag)
        if key is not None:
            if not work._start():
                return None
            early = self.p2p_early[key]
            e = early.popleft()
            if not early:
                del self.p2p_early[key]
            p.matched(e.peer, e.header.seq)
            self._attach(e, p)
            return fut
        gone = self.lost.get(src) if src >= 0 else dead_source(p, self.lost, self.closed_peers)
        if gone is not None:
            if work._start():
                p.fail(gone)
            return fut
        p.order = next(self._posts)
        self.wild.add(ctx, p)
        work._on_cancel = functools.partial(self.loop.call_soon_threadsafe, self.wild.remove, ctx, p)
        if self.on_post is not None:
            self.on_post(src)
        return fut

    def _unpost_p2p(self, key: tuple[int, int, int], p: Posted) -> None:
        queue = self.p2p_posted.get(key)
        if queue and p in queue:
            queue.remove(p)
            if not queue:
                del self.p2p_posted[key]

    def withdraw(self, peer: int, ctx: int, tag: int, fut: asyncio.Future[None]) -> None:
        """A timed-out p2p receive leaves the queue (its successor takes the next message); ``peer`` or
        ``tag`` -1: a wildcard receive."""
        self.rdv.withdraw(fut)
        if peer < 0 or tag < 0:
            self.wild.withdraw(ctx, fut)
            return
        queue = self.p2p_posted.get((peer, ctx, tag))
        if queue:
            for p in list(queue):
                if p.fut is fut:
                    queue.remove(p)
            if not queue:
                del self.p2p_posted[(peer, ctx, tag)]
