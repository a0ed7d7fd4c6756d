"""Matching incoming frames to posted receives: the engine's only receive-side state.

Collective frames are matched by key ``(peer, ctx, seq, k)``: the op's
sequence number and the message's index within the op. Every collective
frame also carries its sender's *fingerprint* (op, dtype, reduction,
count, root); the first frame whose fingerprint differs from this rank's
call fails the op with ``CollectiveMismatch`` and tells every other
rank of the communicator with a MISMATCH notice, so all of them fail the
same op at once instead of timing out (no extra round trip when calls
agree). Point-to-point
frames are matched per ``(peer, ctx, tag)`` in FIFO order, MPI's
non-overtaking rule: the i-th message with a tag goes to the i-th receive
posted for it (a cancelled receive steps aside, so nothing is lost); a
receive from any source or with any tag takes its place among them by
posting order (``wildcards.py``).

A frame whose receive is not posted yet lands in a pooled buffer (counted
against its sender's ``Budget``) and is copied when the receive arrives; a
posted receive gets the payload read straight into its memory. Everything here runs on the engine's loop thread.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from .. import log
from ..errors import AiocclError, PeerLost
from ..transport.frames import (
    COFFER,
    COLL,
    CTS,
    FAIL,
    MAX_FAILURE_BYTES,
    MISMATCH,
    P2P,
    PAUSE,
    PROBE,
    RDATA,
    RDONE,
    RTS,
    Header,
    SaidAbort,
)
from ..work import Work
from . import notice_handling
from .blame import Reports
from .notices import Active, Fingerprint
from .p2p.probes import Probes
from .p2p.rendezvous import Rendezvous
from .p2p.wildcards import Wildcards, dead_source, earliest
from .pool import BufferPool
from .receives import Budget, Early, Posted, drop_unfinished

_log = log.get("COLL")


def p2p_key(peer: int, ctx: int, tag: int) -> tuple[int, int, int]:
    """The key of a point-to-point queue (posted receives, early messages): the sender's world rank, the
    communicator and the tag. The one definition: the pair lane (C, ``pair_held.c``) looks these queues up by
    the same tuple and checks, when it is made, that this is still it."""
    return (peer, ctx, tag)

_net_log = log.get("NET")


class Mailbox:
    """The matching state of one engine: posted receives and early frames, collectives' and messages'."""

    def __init__(self, loop: asyncio.AbstractEventLoop, pool: BufferPool, budget: int = 64 << 20) -> None:
        self.loop = loop
        self.pool = pool
        self.budget = Budget(budget)  # per peer, bytes of early frames; past it, reading from the peer pauses
        self.on_pause: Callable[[int, bool], None] | None = None  # engine hook: a peer paused reading from us
        self.posted: dict[tuple[int, int, int, int], Posted] = {}
        self.early: dict[tuple[int, int, int, int], Early] = {}
        self.p2p_posted: dict[tuple[int, int, int], deque[Posted]] = {}
        self.p2p_early: dict[tuple[int, int, int], deque[Early]] = {}
        self.wild = Wildcards()  # receives from any source or with any tag
        self.probes = Probes()  # probes waiting for a message no receive takes
        self._posts = itertools.count(1)  # point-to-point receives' posting numbers
        self._arrivals = itertools.count(1)  # point-to-point messages' arrival numbers
        self.lost: dict[int, PeerLost] = {}
        # the world rank lost first by a crash, as this rank knows it (its own connection ended, or a peer's abort
        # named it): an abort from here names it in its last words, so that every rank's error blames it
        self.lost_first = -1
        self.reports = Reports()  # per failed collective, whom each reporting rank waited for
        self.rdv = Rendezvous(loop)  # large p2p messages: their ready-to-send, clear-to-send and data
        self.rdv.peer_lost = self.peer_lost
        self.rdv.lost_of = self.lost.get
        self.closed_peers: set[int] = set()  # lost by a graceful close (after finishing their part of every op)
        self.lost_listeners: list[Callable[[int, PeerLost], None]] = []  # e.g. the shared-memory channel
        self._partial: dict[int, list[Posted]] = {}  # receives waiting on a frame still arriving
        self.dead_ops: set[tuple[int, int]] = set()
        self.dead_order: deque[tuple[int, int]] = deque()
        self.active: dict[tuple[int, int], Active] = {}  # (ctx, seq) -> the collective running here
        self._foreign: dict[tuple[int, int], dict[int, Fingerprint]] = {}  # fingerprints that came early
        self.doomed_ops: dict[tuple[int, int], AiocclError] = {}  # failed by a mismatch or a notice (bounded)
        self.finished_ops: dict[tuple[int, int], Active] = {}  # recently completed here (bounded)
        # engine hook: tell the other ranks of (ctx, seq) that world rank `offender` issued `their_fp`
        self.notify: Callable[[int, int, Active, int, Fingerprint], None] | None = None
        # told of every failure notice, with (ctx, seq, error): the shared-memory channel's ops too
        self.failure_listeners: list[Callable[[int, int, AiocclError], None]] = []
        # engine hook: pass a notice (its whole frame) on to an op's ranks, but the one it came from
        self.forward: Callable[[tuple[int, ...], bytes, int], None] | None = None
        # engine hook: a receive or probe was posted for messages from a world rank (-1: any), which a pair's
        # FIFO may hold still (unclaimed below): read them in now
        self.on_post: Callable[[int], None] | None = None

    def unclaimed(self, peer: int, h: Header) -> bool:
        """Would a point-to-point message from ``peer`` arriving now be held for a receive not yet posted
        (no posted receive, wildcard or probe wants it)? Then it may wait in its FIFO instead."""
        return not self.wild and not self.probes and p2p_key(peer, h.ctx, h.seq) not in self.p2p_posted

    # -- from the connections' readers -----------------------------------
    def on_header(self, peer: int, h: Header) -> tuple[memoryview, Callable[[], None]]:
        kind = h.kind
        if kind in (P2P, RTS):  # first: the small message's hot path
            key3 = p2p_key(peer, h.ctx, h.seq)
            p = None
            queue = self.p2p_posted.get(key3)
            if self.wild and h.ctx in self.wild.by_ctx:
                p = self.wild.take(peer, h.ctx, h.seq, queue)
            else:
                while queue:
                    cand = queue.popleft()
                    if cand.work is None or cand.work._start():
                        p = cand
                        break
            if queue is not None and not queue:
                del self.p2p_posted[key3]  # tags are often unique (a step number): keep no empty queues
            rts = (lambda p, offer: self.rdv.match(peer, h, p, self.lost.get(peer), offer)) if kind == RTS else None
            if p is None or rts is not None:  # not posted yet; or a ready-to-send, matched once its offer is in
                e = Early(peer, h, self.pool, self.budget, rts)
                if p is None:
                    e.order = next(self._arrivals)
                    self.p2p_early.setdefault(key3, deque()).append(e)
                    if self.probes:
                        self.probes.arrived(peer, h)
                else:
                    self._attach(e, p)
                return e.view(), e.finish
        elif kind in (COLL, COFFER):  # a collective's message, or its offer to be read in place
            if self._screen(peer, h):
                return self._discard(h)
            key = (peer, h.ctx, h.seq, h.k)
            p = self.posted.pop(key, None)
            if p is None or kind == COFFER:
                e = Early(peer, h, self.pool, self.budget, None if kind == COLL else
                          lambda p, offer: self.rdv.match_offer(peer, h, p, self.lost.get(peer), offer))
                if p is None:
                    self.early[key] = e
                else:
                    self._attach(e, p)
                return e.view(), e.finish
        elif kind == MISMATCH:
            buf = self.pool.acquire(h.nbytes)
            return buf.data[: h.nbytes], lambda: notice_handling.on_notice(self, peer, h, buf)
        elif kind == PROBE:  # a peer waiting on this rank shows its call: only the fingerprint counts
            self._screen(peer, h)
            return self._discard(h)
        elif kind == FAIL:
            if h.nbytes > MAX_FAILURE_BYTES:
                return self._discard(h)
            buf = self.pool.acquire(h.nbytes)
            return buf.data[: h.nbytes], lambda: notice_handling.on_failure(self, peer, h, buf)
        elif kind == PAUSE:
            if self.on_pause is not None:
                self.on_pause(peer, bool(h.seq))
            return self._discard(h)
        elif kind in (CTS, RDONE):
            self.rdv.on_cts(peer, h)
            return self._discard(h)
        elif kind == RDATA:
            posted = self.rdv.on_data(peer, h)
            if posted is None or h.nbytes != len(posted.target):
                return self._discard(h)
            return posted.target, posted.complete
        else:  # BYE is the reader's; unpack() refused any other kind
            return self._discard(h)
        err = p.mismatch(peer, h)
        if err is not None:
            p.fail(err)
            return self._discard(h)
        return p.target, p.complete

    def _screen(self, peer: int, h: Header) -> bool:
        """Compare a collective frame's (or probe's) fingerprint with this rank's call at the same seq;
        True when the frame is to be dropped (its op is dead here, or the calls differ)."""
        op_key = (h.ctx, h.seq)
        if op_key in self.dead_ops:
            return True
        active = self.active.get(op_key)
        if active is None and op_key in self.finished_ops:
            # this rank's part ended (a send-only role) before a peer's other call reached it:
            # it cannot take its result back, but the ranks still waiting must not time out
            done = self.finished_ops[op_key]
            if h.fingerprint() != done.fp:
                exc = done.mismatch(h.ctx, h.seq, peer, h.fingerprint(), done.ranks[done.rank], done.fp)
                _log.error("%s (this rank's part had already finished; the ranks still in it fail)", exc)
                if self.notify is not None:
                    self.notify(h.ctx, h.seq, done, peer, h.fingerprint())
            return True
        if active is not None:
            if h.fingerprint() != active.fp:
                exc = active.mismatch(h.ctx, h.seq, peer, h.fingerprint(), active.ranks[active.rank], active.fp)
                self.fail_op(h.ctx, h.seq, exc)
                if self.notify is not None:
                    self.notify(h.ctx, h.seq, active, peer, h.fingerprint())
                return True
            return h.kind not in (COLL, COFFER)
        seen = self._foreign.get(op_key)
        if seen is None:
            if len(self._foreign) >= 4096:  # fingerprints of ops never begun here stay bounded
                del self._foreign[next(iter(self._foreign))]
            self._foreign[op_key] = {peer: h.fingerprint()}
        elif peer not in seen:
            seen[peer] = h.fingerprint()
        return h.kind not in (COLL, COFFER)

    def _discard(self, h: Header) -> tuple[memoryview, Callable[[], None]]:
        buf = self.pool.acquire(h.nbytes)
        return buf.data[: h.nbytes], lambda: self.pool.release(buf)

    def peer_lost(self, peer: int, detail: str) -> PeerLost:
        """The error of a connection to ``peer`` that ended without a graceful close, naming the rank this rank
        lost first when that is another: a peer that aborted in the middle of a frame leaves no last words
        (``abort_words``), so its end looks like a crash, and the rank that did crash is the likelier cause."""
        first = self.lost_first
        if 0 <= first != peer:
            detail += f"; rank {first} was lost before it, the first failure this rank saw"
        return PeerLost(peer, detail)

    def on_lost(self, peer: int, exc: BaseException, graceful: bool) -> None:
        aborted = isinstance(exc, SaidAbort)
        named = exc.lost_first if isinstance(exc, SaidAbort) else -1  # (whom its abort said it had lost)
        said = str(exc) if aborted else f"{type(exc).__name__}: {exc}"
        if graceful:
            lost = PeerLost(peer, "it closed its communicator")
        elif 0 <= named != peer:  # it aborted because it had lost ``named``: that is the rank this error names
            lost = PeerLost(named, f"rank {peer} called abort() after it lost rank {named} (reported by rank {peer}, "
                                   "no crash of its own)")
        else:
            lost = self.peer_lost(peer, said)
        if not graceful and self.lost_first < 0:  # (a peer that aborted naming nobody is where it began)
            self.lost_first = named if named >= 0 else peer
        if peer not in self.lost:  # once per peer, though a same-host peer's socket and ring both end
            _net_log.log(logging.INFO if graceful else logging.WARNING, "%s", lost)
        self.lost[peer] = lost
        if graceful:
            self.closed_peers.add(peer)
        for key in [k for k in self.posted if k[0] == peer]:
            self.posted.pop(key).fail(lost)
        for key3 in [k for k in self.p2p_posted if k[0] == peer]:
            for p in self.p2p_posted.pop(key3):
                if p.work is None or p.work._start():
                    p.fail(lost)
        for p in list(self.wild.on_lost(peer, self.lost, self.closed_peers)):
            if p.work is None or p.work._start():
                p.fail(lost)
        drop_unfinished(self.early, self.p2p_early, peer)  # what fully arrived is still good: kept
        for p in self._partial.pop(peer, ()):
            p.fail(lost)
        self.rdv.on_lost(peer, lost)
        self.probes.on_lost(peer, self.lost, self.closed_peers)
        # a crash fails every collective running here that includes the peer, not only those receiving
        # from it: a rank waiting on a live peer that is itself stuck on the lost one would time out.
        # A peer that closed its communicator finished its part of every op first: only its receives fail.
        # So did one that aborted, for the ops it had finished; those it gave up it reported (FAIL notices
        # sent ahead of its last words), so an op here that has all it needs of it can still complete.
        told = graceful or aborted
        for (ctx, seq), active in list(self.active.items()) if not told else ():
            if peer in active.ranks:
                self.fail_op(ctx, seq, PeerLost(peer, f"{lost.detail} (during seq {seq} on comm {ctx:x})"))
        for listener in self.lost_listeners:
            listener(peer, lost)

    # -- collectives: fingerprints and mismatches ----------------------------
    def begin(self, ctx: int, seq: int, fp: Fingerprint, ranks: tuple[int, ...], rank: int
              ) -> AiocclError | None:
        """A collective starts here; returns its error if a peer's frame or notice already doomed it."""
        op_key = (ctx, seq)
        doomed = self.doomed_ops.get(op_key)
        if doomed is not None:
            return doomed
        for r in ranks:  # a crashed rank dooms it; one that closed had finished its part of every op first
            lost = self.lost.get(r)
            if lost is not None and r not in self.closed_peers:
                return PeerLost(r, f"{lost.detail} (before seq {seq} on comm {ctx:x} began)")
        active = self.active[op_key] = Active(fp, ranks, rank)
        for peer, theirs in self._foreign.pop(op_key, {}).items():
            if theirs != fp:
                exc = active.mismatch(ctx, seq, peer, theirs, ranks[rank], fp)
                self.fail_op(ctx, seq, exc)
                if self.notify is not None:
                    self.notify(ctx, seq, active, peer, theirs)
                return exc
        return None

    def doomed(self, ctx: int, seq: int) -> AiocclError | None:
        """The error a peer's notice already gave collective ``seq`` (None: none came)."""
        return self.doomed_ops.get((ctx, seq))

    def end(self, ctx: int, seq: int) -> AiocclError | None:
        """The collective's schedule ran to its end here; returns its error if a peer's different
        call reached it meanwhile (a send-only part finishes without noticing otherwise)."""
        doomed = self.doomed_ops.get((ctx, seq)) if self.doomed_ops else None
        if doomed is not None:
            return doomed
        active = self.active.pop((ctx, seq), None)
        if active is not None:
            self.finished_ops[(ctx, seq)] = active
            if len(self.finished_ops) > 1024:
                del self.finished_ops[next(iter(self.finished_ops))]
        return None

    def fail_op(self, ctx: int, seq: int, exc: AiocclError) -> None:
        """Fail the collective (ctx, seq): its posted receives now, its later ones when posted.
        The first cause wins: a later one (say the EOF of a rank that gave up) never replaces it."""
        op_key = (ctx, seq)
        if op_key in self.doomed_ops:
            return
        self.doomed_ops[op_key] = exc
        if len(self.doomed_ops) > 4096:
            del self.doomed_ops[next(iter(self.doomed_ops))]
        for key in [k for k in self.posted if k[1] == ctx and k[2] == seq]:
            self.posted.pop(key).fail(exc)

    # -- from ops ----------------------------------------------------------
    def post(self, peer: int, ctx: int, seq: int, k: int, target: memoryview, op: int, dtype: int,
             what: str) -> asyncio.Future[None]:
        fut = self.loop.create_future()
        p = Posted(target, fut, op, dtype, what, None)
        key = (peer, ctx, seq, k)
        doomed = self.doomed_ops.get((ctx, seq)) if self.doomed_ops else None
        if doomed is not None:
            p.fail(doomed)
            return fut
        e = self.early.pop(key, None)
        if e is not None:
            self._attach(e, p)
        elif peer in self.lost:
            p.fail(self.lost[peer])
        else:
            self.posted[key] = p
        return fut

    def _attach(self, e: Early, p: Posted) -> None:
        if e.done:
            e.deliver(p)
        else:
            e.expected(p)
            self._partial.setdefault(e.peer, []).append(p)
            p.fut.add_done_callback(lambda _f: self._partial.get(e.peer, []).remove(p)
                                    if p in self._partial.get(e.peer, []) else None)

    def forget_op(self, ctx: int, seq: int) -> None:
        """A failed collective: drop its posted receives and discard its late frames."""
        for key in [k for k in self.posted if k[1] == ctx and k[2] == seq]:
            del self.posted[key]
        for key in [k for k in self.early if k[1] == ctx and k[2] == seq]:
            e = self.early.pop(key)
            if e.done:
                e.free()
            else:
                e.drop()
        self.active.pop((ctx, seq), None)
        self._foreign.pop((ctx, seq), None)
        self.dead_ops.add((ctx, seq))
        self.dead_order.append((ctx, seq))
        if len(self.dead_order) > 4096:
            self.dead_ops.discard(self.dead_order.popleft())

    def fail_all(self, exc: BaseException) -> None:
        for p in self.posted.values():
            p.fail(exc)
        self.posted.clear()
        for queue in self.p2p_posted.values():
            for p in queue:
                p.fail(exc)
        self.p2p_posted.clear()
        for p in self.wild.all():
            p.fail(exc)
        self.wild.clear()
        self.probes.fail_all(exc)

    # -- point-to-point receives: posted into their (peer, ctx, tag) queue, or a wildcard into its list --------
    def post_p2p(self, peer: int, ctx: int, tag: int, target: memoryview, dtype: int, what: str,
                 work: Work[Any]) -> asyncio.Future[None] | None:
        """Post a receive; None if ``work`` was cancelled before it could be posted."""
        key = p2p_key(peer, ctx, tag)
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
        key = p2p_key(peer, ctx, tag)
        queue = self.p2p_posted.get(key)
        if queue:
            for p in list(queue):
                if p.fut is fut:
                    queue.remove(p)
            if not queue:
                del self.p2p_posted[key]
