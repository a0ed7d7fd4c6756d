"""Starting a point-to-point op (a send, a receive, a probe, a drain): at once when it can, else as a wait
under its deadline.

A small send to a shared-memory pair is written into the FIFO (to a TCP
peer, into the socket) inside the call that issued it, and a receive first
looks at the FIFO and spins on it briefly (``AIOCCL_SHM_SPIN_US``; over TCP
it reads the socket for up to ``AIOCCL_NET_SPIN_US``) when the engine runs
inline on this loop: a ping-pong then completes without a task, a timer or a
wake-up through the kernel per message. Everything else (a full or busy
FIFO, an ib peer, a receive whose message is late) takes the general path:
a send task under the op's deadline, or a receive that two callbacks finish
(its message, or its deadline).

Sends to one peer stay in posting order (MPI's non-overtaking rule): a send
is written at once only while no earlier send to that peer is still queued.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any

from ...envvars import env_int
from ...errors import AiocclError, CollectiveTimeout
from ...transport.frames import P2P
from ...transport.frames import pack as pack_header
from ...transport.shm.fifo import HEAD, TAIL
from ...transport.shm.pair import ShmPairConnection
from ...transport.tcp import TcpConnection
from ...work import Work
from ..receives import Early
from . import rendezvous
from .offers import OFFER, Offer
from .probes import Message, Probe
from .put_off import put_off, waiting
from .wildcards import earliest

DEFAULT_NET_SPIN_US = 50
MAX_STREAM_SPIN_S = 0.02  # a receive spins past its spin time while a frame streams in, but no longer than this

if TYPE_CHECKING:
    from ..services import EngineServices
    from ..view import CommView


def start_send(eng: EngineServices, comm: CommView, peer: int, tag: int, payload: memoryview, dtype_code: int,
               timeout: float, work: Work[Any], result: Any) -> Coroutine[Any, Any, None] | None:
    world = comm.ranks[peer]
    if waiting(eng, world):  # sends the lane put off go first: this one joins them (put_off.py)
        put_off(eng, world, functools.partial(_send_later, eng, comm, peer, tag, payload, dtype_code, timeout, work,
                                              result))
        return None
    return send_now(eng, comm, peer, tag, payload, dtype_code, timeout, work, result)


def _send_later(eng: EngineServices, comm: CommView, peer: int, tag: int, payload: memoryview, dtype_code: int,
                timeout: float, work: Work[Any], result: Any) -> bool:
    if not work.done():  # (withdrawn or failed meanwhile: nothing to send)
        coro = send_now(eng, comm, peer, tag, payload, dtype_code, timeout, work, result)
        if coro is not None:
            eng.spawn(coro)
    return True


def send_now(eng: EngineServices, comm: CommView, peer: int, tag: int, payload: memoryview, dtype_code: int,
             timeout: float, work: Work[Any], result: Any) -> Coroutine[Any, Any, None] | None:
    """``start_send`` with nothing put off before it: written now if it can be, else a send task."""
    world = comm.ranks[peer]
    conn = eng.conns.get(world)
    if (isinstance(conn, (ShmPairConnection, TcpConnection)) and eng.aborted is None
            and not eng.queued_sends.get(world) and len(payload) <= eng.eager):
        hdr = pack_header(P2P, 0, dtype_code, 0, comm.ctx, tag, len(payload))
        if conn.send_now(hdr, payload):
            work._start_done(result)
            return None
    eng.queued_sends[world] = eng.queued_sends.get(world, 0) + 1
    eng.send_queue.add(world, len(payload))
    return _send(eng, comm, peer, tag, payload, dtype_code, timeout, work, result)


async def _send(eng: EngineServices, comm: CommView, peer: int, tag: int, payload: memoryview, dtype_code: int,
                timeout: float, work: Work[Any], result: Any) -> None:
    world = comm.ranks[peer]
    try:
        if not work._start():
            return
        if eng.aborted is not None:
            raise eng.aborted
        if len(payload) <= eng.eager:
            async with asyncio.timeout(timeout):
                await eng.send(world, pack_header(P2P, 0, dtype_code, 0, comm.ctx, tag, len(payload)), payload)
        else:
            await _rendezvous(eng, world, comm.ctx, tag, payload, dtype_code, timeout)
        work._set_result(result)
    except TimeoutError:
        work._set_exception(CollectiveTimeout(f"send(peer={peer}, tag={tag})", tag, [peer], timeout))
    except AiocclError as e:
        work._set_exception(e)
    finally:
        eng.queued_sends[world] -= 1
        eng.send_queue.done(world, len(payload))


async def _rendezvous(eng: EngineServices, world: int, ctx: int, tag: int, payload: memoryview, dtype_code: int,
                      timeout: float) -> None:
    """RTS, then the data once the receiver clears it, or nothing when the receiver reads it in place
    (a same-host pair with cross-memory attach: the RTS carries an offer, ``offers.py``)."""
    rdv = eng.mailbox.rdv
    conn = eng.conns.get(world)
    offer = Offer.make(payload) if getattr(conn, "memory", None) is not None else None
    rid, cts = rdv.expect_cts(world)
    hdr = rendezvous.rts(ctx, tag, dtype_code, len(payload), rid, OFFER.size if offer else 0)
    try:
        try:
            async with asyncio.timeout(timeout):
                await eng.send(world, hdr, memoryview(offer.packed) if offer else None)
                if isinstance(conn, ShmPairConnection):  # on while the receiver reads it
                    _spin(eng, conn, cts, offer.taken if offer else None)
                answer = await asyncio.shield(cts)  # the receiver posted a receive for it
        except TimeoutError:
            if offer is None or offer.withdraw():
                raise  # never taken, and now it never will be: the user may have the buffer back
            async with asyncio.timeout(timeout):  # taken just now: the read is under way, a copy in memory
                answer = await cts
            if answer != rendezvous.WAS_READ:
                raise
        if answer == rendezvous.SEND_DATA:
            async with asyncio.timeout(timeout):
                await eng.send(world, rendezvous.data(ctx, tag, dtype_code, len(payload), rid), payload)
    finally:
        rdv.forget(world, rid)
        if offer is not None:
            offer.release()


def _spin(eng: EngineServices, conn: ShmPairConnection, fut: asyncio.Future[Any],
          busy: Callable[[], bool] | None = None) -> None:
    """While the engine runs inline, look at the FIFO for ``fut``'s frame for up to ``AIOCCL_SHM_SPIN_US``
    (longer while a frame streams in, or while ``busy()``) before leaving the wait to the bell: a wake-up
    through the kernel costs more than a round trip."""
    conn.pump()  # it may be in the FIFO already, its bell not yet heard
    spin = conn.hub.spin_s if eng.placement.kind == "inline" else 0.0
    if spin and not fut.done():
        now = time.perf_counter()
        end, last = now + spin, now + MAX_STREAM_SPIN_S
        conn.watch(True)  # the peer's frames need no bell meanwhile
        ctl, clock, done, polite = conn.rx.ctl, time.perf_counter, fut.done, conn.hub.yield_cpu
        try:
            while not done() and not conn.closed and now < last:
                if polite:
                    os.sched_yield()
                if ctl[HEAD] != ctl[TAIL]:  # one look at the counters per turn; the reader only for bytes
                    conn.pump()
                now = clock()
                if now > end and not conn.reader.streaming() and not (busy is not None and busy()):
                    break
        finally:
            conn.watch(False)


def net_spin_s(env: Mapping[str, str] = os.environ) -> float:
    """``AIOCCL_NET_SPIN_US``: how long a receive over TCP reads its socket before it leaves the wait to
    the event loop (0: never), in seconds."""
    return env_int(env, "AIOCCL_NET_SPIN_US", DEFAULT_NET_SPIN_US, 0, 1_000_000) * 1e-6


def _poll(conn: TcpConnection, fut: asyncio.Future[Any], spin_s: float) -> None:
    """Read the socket without waiting for the loop to say it is readable, for up to ``spin_s``: a
    reply that comes within it skips the kernel's wake-up and a loop turn (``AIOCCL_NET_SPIN_US``)."""
    now = time.perf_counter()
    end, last = now + spin_s, now + MAX_STREAM_SPIN_S
    while not fut.done() and not conn.closed and now < last:
        conn.poll()
        now = time.perf_counter()
        if now > end and not conn.reader.streaming():  # on while a payload streams in, as on a FIFO
            break


def start_recv(eng: EngineServices, comm: CommView, peer: int, tag: int, target: memoryview, dtype_code: int,
               timeout: float, work: Work[Any], result: Any, spin: bool = True) -> None:
    """``spin``: False when the native lane has just spun on the FIFO for it (``lanes/pair.py``)."""
    what = work.op
    if eng.aborted is not None:
        if work._start():
            work._set_exception(eng.aborted)
        return None
    world = comm.ranks[peer]
    fut = eng.mailbox.post_p2p(world, comm.ctx, tag, target, dtype_code, what, work)
    if fut is None:
        return None
    conn = eng.conns.get(world)
    if isinstance(conn, ShmPairConnection) and not fut.done():
        if spin:
            _spin(eng, conn, fut)
        else:
            conn.pump()  # (the lane stopped watching the FIFO: a frame published since rang no bell)
    elif isinstance(conn, TcpConnection) and not fut.done() and eng.net_spin_s and eng.placement.kind == "inline":
        _poll(conn, fut, eng.net_spin_s)
    if _settled(fut, work, result):
        return None
    _settle_later(eng, comm, comm.ranks[peer], peer, tag, fut, what, timeout, work, result)
    return None


def start_recv_any(eng: EngineServices, comm: CommView, peer: int, tag: int, target: memoryview, dtype_code: int,
                   timeout: float, work: Work[Any], result: Any, spin: bool = True) -> None:
    """A receive from any source (``peer`` -1) or with any tag (``tag`` -1): the earliest message that fits,
    after every receive posted before it has had its pick (``wildcards.py``)."""
    if eng.aborted is not None:
        if work._start():
            work._set_exception(eng.aborted)
        return None
    src = comm.ranks[peer] if peer >= 0 else -1
    ranks = tuple(-1 if r == comm.rank else w for r, w in enumerate(comm.ranks))
    fut = eng.mailbox.post_any(src, comm.ctx, tag, ranks, target, dtype_code, work.op, work)
    if fut is None:
        return None
    if not fut.done():  # what sits in the FIFOs already, its bell not yet heard
        for w in ranks if src < 0 else (src,):
            conn = eng.conns.get(w)
            if isinstance(conn, ShmPairConnection):
                conn.pump()
    if _settled(fut, work, result):
        return None
    _settle_later(eng, comm, src, peer, tag, fut, work.op, timeout, work, result)
    return None


def _settled(fut: asyncio.Future[None], work: Work[Any], result: Any) -> bool:
    """Finish ``work`` now if its message is in (True)."""
    if not fut.done() or fut.cancelled():
        return False
    exc = fut.exception()
    if exc is None:
        work._set_result(result)
    else:
        work._set_exception(exc)
    return True


def _settle_later(eng: EngineServices, comm: CommView, world: int, peer: int, tag: int, fut: asyncio.Future[None],
                  what: str, timeout: float, work: Work[Any], result: Any) -> None:
    """Finish ``work`` when its message has arrived, or fail it at its deadline: two callbacks, not a
    task (a task, its timeout scope and a shield cost a loop turn and more than a small message)."""

    def expire() -> None:
        eng.timers.discard(timer)
        if fut.done():
            return
        eng.mailbox.withdraw(world, comm.ctx, tag, fut)  # its successor takes the next message
        if work._start() or not work.done():
            silent = [peer] if peer >= 0 else [r for r in range(comm.size) if r != comm.rank]
            work._set_exception(CollectiveTimeout(what, tag, silent, timeout))

    def arrived(f: asyncio.Future[None]) -> None:
        timer.cancel()
        eng.timers.discard(timer)
        if f.cancelled():
            return
        exc = f.exception()
        if exc is None:
            work._set_result(result)
        else:
            work._set_exception(exc)

    timer = eng.loop.call_later(timeout, expire)
    eng.timers.add(timer)
    fut.add_done_callback(arrived)


def start_probe(eng: EngineServices, comm: CommView, peer: int, tag: int, timeout: float, work: Work[Message]) -> None:
    """Answer at once from the messages waiting here, else wait for the next that fits (under ``timeout``)."""
    if eng.aborted is not None:
        if work._start():
            work._set_exception(eng.aborted)
        return
    box = eng.mailbox
    src = comm.ranks[peer] if peer >= 0 else -1
    ranks = tuple(-1 if r == comm.rank else w for r, w in enumerate(comm.ranks))
    p = Probe(comm.ctx, src, tag, ranks, work)
    key = earliest(box.p2p_early, comm.ctx, src, tag)
    if key is not None:
        e: Early = box.p2p_early[key][0]
        p.answer(e.peer, e.header)
        return
    gone = p.gone(box.lost, box.closed_peers)
    if gone is not None:
        if work._start():
            work._set_exception(gone)
        return
    probes = box.probes
    probes.waiting.append(p)
    if box.on_post is not None:
        box.on_post(src)  # a message it wants may wait in a FIFO: read it in (the probe takes it as it arrives)
        if work.done():
            return

    def expire() -> None:
        probes.withdraw(p)
        if work._start():
            silent = [peer] if peer >= 0 else [r for r in range(comm.size) if r != comm.rank]
            work._set_exception(CollectiveTimeout(work.op, tag, silent, timeout))

    p.timer = eng.loop.call_later(timeout, expire)
    work._on_cancel = lambda: eng.placement.call(probes.withdraw, p)


def start_drain(eng: EngineServices, comm: CommView, peer: int, timeout: float, work: Work[None]) -> None:
    """Done at once while the queue to ``peer`` (-1: every peer) is within the limit, else when it drains."""
    if eng.aborted is not None:
        if work._start():
            work._set_exception(eng.aborted)
        return
    queue = eng.send_queue
    peers = (comm.ranks[peer],) if peer >= 0 else tuple(w for r, w in enumerate(comm.ranks) if r != comm.rank)
    if not queue.over(peers):
        work._start_done(None)
        return
    work._start()
    fut: asyncio.Future[None] = eng.loop.create_future()
    queue.wait(peers, fut)

    def expire() -> None:
        if not fut.done():
            fut.cancel()
            slow = [comm.ranks.index(w) for w in queue.over(peers)]
            work._set_exception(CollectiveTimeout(work.op, -1, slow, timeout,
                                                  f"{queue.limit} bytes of sends still queued to each"))

    timer = eng.loop.call_later(timeout, expire)

    def drained(f: asyncio.Future[Any]) -> None:
        timer.cancel()
        if not f.cancelled():
            work._set_result(None)

    fut.add_done_callback(drained)
