"""Sends the pair lane put off: per peer, in posting order, tried again from the event loop.

A lane send on the engine's own thread that finds its FIFO full waits for room in C
(``native/src/py/pair_room.c``) only while the loop has nothing else to run. When the loop is wanted (a
timer, a ready callback), it stops and the send is *put off*: its Work waits here and the loop tries it
again once it has run what waited (``drain``), through the lane. Why: a send that went the general way
instead queued every later send to that peer behind it in the engine (sends keep their order), and in a
pipeline whose first stage runs ahead that queue never empties: one timer firing during a wait sent a
whole stream of 1 MiB microbatches through Python for good (4 stages on 2 cores: ~950 us each against
~710 through the lane).

While anything to a peer is put off, every later send to it joins the queue (the lane puts it off too, and
``starts.start_send`` appends what goes the general way), so order holds. A put-off send that the
lane no longer takes (the communicator closed, the peer lost) goes the general way from the queue, which
then says what became of it; one that waited past its deadline fails with ``CollectiveTimeout``. While any
waits, the FIFO to the peer says its sender is blocked, as the engine's own sends do when they wait for room:
the peer's reader then reads in what its lane left in the FIFO, for the message it waits for may be behind.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...transport.shm.pair import ShmPairConnection

if TYPE_CHECKING:
    from ..services import EngineServices

Item = Callable[[], bool]  # tries the send: True done (sent, handed on, failed or withdrawn), False not yet
FAST_TRIES = 8  # tries at the loop's next turns; past them, at the receiver's bell (it took a frame) or every POLL_S
POLL_S = 0.01


class Waiting(deque[Item]):
    """A peer's put-off sends, and the loop's next try of them (one at a time)."""

    def __init__(self) -> None:
        super().__init__()
        self.next: asyncio.Handle | None = None
        self.polling = False  # the next try is the slow poll's, which the receiver's bell may bring forward


def put_off(eng: EngineServices, world: int, item: Item) -> None:
    """Queue ``item``, a send to world rank ``world``, behind what waits for it already."""
    queue = eng.put_off.get(world)
    if queue is None:
        queue = eng.put_off[world] = Waiting()
    queue.append(item)
    eng.queued_sends[world] = eng.queued_sends.get(world, 0) + 1
    if len(queue) == 1:
        conn = eng.conns.get(world)
        if isinstance(conn, ShmPairConnection) and not conn.closed:
            conn.put_off(functools.partial(_room, eng, world))
        _again(eng, world, queue, 0)


def _again(eng: EngineServices, world: int, queue: Waiting, tries: int) -> None:
    queue.polling = tries >= FAST_TRIES
    if queue.polling:
        queue.next = eng.loop.call_later(POLL_S, drain, eng, world, tries)
    else:
        queue.next = eng.loop.call_soon(drain, eng, world, tries)


def _room(eng: EngineServices, world: int) -> None:
    """The receiver freed room in the FIFO (its bell): a queue that polls tries again now."""
    queue = eng.put_off.get(world)
    if queue is not None and queue.polling and queue.next is not None:
        queue.next.cancel()
        _again(eng, world, queue, FAST_TRIES - 1)


def waiting(eng: EngineServices, world: int) -> bool:
    """Is anything to ``world`` put off (so a new send to it must queue behind)?"""
    return bool(eng.put_off.get(world))


def drain(eng: EngineServices, world: int, tries: int) -> None:
    """Try the queue to ``world`` in order, until one is not sent yet; again at the loop's next turn (or, after
    ``FAST_TRIES`` turns without progress, at the receiver's bell or every ``POLL_S``) while any waits."""
    queue = eng.put_off.pop(world, None)  # (out of sight meanwhile: the lane declines sends to a peer with any)
    if not queue:
        return
    queue.next = None
    eng.queued_sends[world] -= len(queue)  # nor must it decline them as queued behind themselves
    sent = 0
    try:
        while queue:
            if not queue[0]():
                break
            queue.popleft()
            sent += 1
    finally:
        eng.queued_sends[world] += len(queue)
        if queue:
            queue.extend(eng.put_off.pop(world, ()))  # (put off while it ran: after these)
            eng.put_off[world] = queue
    if queue:
        _again(eng, world, queue, 0 if sent else tries + 1)
        return
    conn = eng.conns.get(world)
    if isinstance(conn, ShmPairConnection):
        conn.put_off(None)
