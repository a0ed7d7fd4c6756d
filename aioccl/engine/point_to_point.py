"""Starting a send or a receive: at once when shared memory allows, else as a task under its deadline.

Over a shared-memory pair a small send is written into the ring inside the
call that issued it, and a receive first looks at the ring (and spins on it
briefly, ``AIOCCL_SHM_SPIN_US``, when the engine runs inline on this loop): a
ping-pong then completes without a task, a timer or a wake-up through the
kernel per message. Everything else (a ring that is full or busy, a TCP or
ib peer, a receive whose message is late) takes the general path: a task that
waits under the op's deadline.

Sends to one peer stay in posting order (MPI's non-overtaking rule): a send
is written at once only while no earlier send to that peer is still queued.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from ..errors import AiocclError, CollectiveTimeout
from ..transport.frames import P2P, Header
from ..transport.shm_pair import ShmPairConnection
from ..work import Work
from . import rendezvous

if TYPE_CHECKING:
    from .engine import Engine
    from .view import CommView


def start_send(eng: Engine, comm: CommView, peer: int, tag: int, payload: memoryview, dtype_code: int,
               timeout: float, work: Work[Any], result: Any) -> Coroutine[Any, Any, None] | None:
    world = comm.ranks[peer]
    conn = eng.conns.get(world)
    if (isinstance(conn, ShmPairConnection) and eng.aborted is None and not eng.queued_sends.get(world)
            and len(payload) <= eng.eager):
        hdr = Header(P2P, 0, dtype_code, 0, comm.ctx, tag, len(payload)).pack()
        if conn.send_now(hdr, payload):
            if work._start():
                work._set_result(result)
            return None
    eng.queued_sends[world] = eng.queued_sends.get(world, 0) + 1
    return _send(eng, comm, peer, tag, payload, dtype_code, timeout, work, result)


async def _send(eng: Engine, comm: CommView, peer: int, tag: int, payload: memoryview, dtype_code: int,
                timeout: float, work: Work[Any], result: Any) -> None:
    world = comm.ranks[peer]
    try:
        if not work._start():
            return
        if eng.aborted is not None:
            raise eng.aborted
        async with asyncio.timeout(timeout):
            if len(payload) <= eng.eager:
                await eng.send(world, Header(P2P, 0, dtype_code, 0, comm.ctx, tag, len(payload)).pack(), payload)
            else:
                rid, cts = eng.mailbox.rdv.expect_cts(world)
                try:
                    await eng.send(world, rendezvous.rts(comm.ctx, tag, dtype_code, len(payload), rid), None)
                    await cts  # the receiver has posted a receive for it
                    await eng.send(world, rendezvous.data(comm.ctx, tag, dtype_code, len(payload), rid), payload)
                finally:
                    eng.mailbox.rdv.forget(world, rid)
        work._set_result(result)
    except TimeoutError:
        work._set_exception(CollectiveTimeout(f"send(peer={peer}, tag={tag})", tag, [peer], timeout))
    except AiocclError as e:
        work._set_exception(e)
    finally:
        eng.queued_sends[world] -= 1


def start_recv(eng: Engine, comm: CommView, peer: int, tag: int, target: memoryview, dtype_code: int,
               timeout: float, work: Work[Any], result: Any) -> Coroutine[Any, Any, None] | None:
    what = f"recv(peer={peer}, tag={tag})"
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
        conn.pump()  # it may be in the ring already, its bell not yet heard
        spin = conn.hub.spin_s if eng.placement.kind == "inline" else 0.0
        if spin and not fut.done():
            end = time.perf_counter() + spin
            while not fut.done() and not conn.closed and time.perf_counter() < end:
                conn.pump()
    if fut.done() and not fut.cancelled():
        exc = fut.exception()
        if exc is None:
            work._set_result(result)
        else:
            work._set_exception(exc)
        return None
    return _recv(eng, comm, peer, tag, fut, what, timeout, work, result)


async def _recv(eng: Engine, comm: CommView, peer: int, tag: int, fut: asyncio.Future[None], what: str,
                timeout: float, work: Work[Any], result: Any) -> None:
    try:
        async with asyncio.timeout(timeout):
            await asyncio.shield(fut)
        work._set_result(result)
    except TimeoutError:
        eng.mailbox.withdraw(comm.ranks[peer], comm.ctx, tag, fut)
        if work._start() or not work.done():
            work._set_exception(CollectiveTimeout(what, tag, [peer], timeout))
    except AiocclError as e:
        work._set_exception(e)
