"""The point-to-point lane's one owner: ``open_pair_lane`` gives a communicator its ``PairLane`` (C,
``native/src/py/pair_lane.c``) when the engine has shared-memory pairs and the native core is loaded.

``comm.isend(x, peer)`` and ``comm.irecv(buf, peer)`` of a contiguous numpy array to or from a same-host
peer, called on the engine's thread (the inline engine's: the caller's loop) or on another thread while a
proxy thread's engine is idle (borrowed for the call, as ``Placement.borrow``: synchronous code, torch's
backend), then run from the call to the done Work in C while nothing else is in their way: an eager send
whose frame fits the FIFO with nothing queued before it, and a receive whose message is first in the FIFO
(or comes within the pair's spin) with nothing posted or held before it. From 64 KiB a receive that spins
announces its buffer and the send writes the payload straight into it (cross-memory attach: one copy).
Everything else (a rendezvous, a late message, wildcards, probes, deadlines that must run, a lost peer) is
the engine's, as before: the lane answers None and the general way runs. A send whose FIFO stays full while
the loop is wanted answers False and is put off (``put_off``): tried again through the lane from the loop. It is off
(``enabled``) once the communicator is closed, aborted, shrunk or has lost a rank (``FastLane._lane_off``),
and never made with ``AIOCCL_NATIVE=0``.

Callers outside Python use the same lane and the same borrowing: jax_ext's point-to-point custom calls,
from XLA's thread (``native/src/py/pair_native.c``). A borrower that took what the engine held wakes its
loop (``Placement.wake``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from . import native
from .buffers import byte_view
from .dtypes import dtype_code
from .engine.p2p.put_off import put_off as put_off_send
from .engine.p2p.starts import send_now
from .engine.receives import Status
from .engine.turns import loop_slice_s, loop_waits
from .envvars import env_int
from .errors import CollectiveTimeout
from .group import current_group
from .transport.shm.pair import ShmPairConnection
from .work import BORN_DONE_LOCK, Work

if TYPE_CHECKING:
    from .engine.engine import Engine
    from .engine.view import CommView


def open_pair_lane(engine: Engine, view: CommView, record: Any) -> Any:
    """The communicator's PairLane, or None: no native core, or no shared-memory pair in the engine."""
    core, hub = native.core, engine.pair_hub
    if core is None or hub is None:
        return None
    hub.unclaimed = engine.mailbox.unclaimed  # a pump leaves the last message in the FIFO for the lane to take
    bell = hub.bell.bell
    box = engine.mailbox
    placement = engine.placement
    return core.PairLane(
        engine, engine.conns, engine.queued_sends, box.p2p_posted, box.p2p_early, box.wild.by_ctx,
        box.probes.waiting, box.lost, ShmPairConnection, view.ctx, tuple(view.ranks), view.rank, Work,
        BORN_DONE_LOCK, placement, placement.thread_id, current_group, record, Status, dtype_code, engine.eager,
        hub.spin_s, hub.yield_cpu, bell.sender(), tuple(bell.address(bell.comm_id, w) for w in view.ranks),
        placement.lock, placement.wake, functools.partial(loop_waits, engine.loop), loop_slice_s(), stall_s(),
        engine.put_off)


def stall_s(env: Mapping[str, str] = os.environ) -> float:
    """``AIOCCL_SHM_STALL_MS``: how long a send that finds its FIFO full waits for a receiver that takes
    nothing before it is put off (``native/src/py/pair_room.c``, ``put_off``), in seconds."""
    return env_int(env, "AIOCCL_SHM_STALL_MS", 20, 1, 3_600_000) * 1e-3


def put_off(eng: Engine, view: CommView, lane: Any, x: np.ndarray, peer: int, tag: int, timeout: float,
            work: Work[None]) -> None:
    """Start a send the lane put off (its FIFO stayed full while the loop was wanted): it waits in the engine's
    queue for that peer and goes through the lane from the loop (``engine/p2p/put_off.py``)."""
    due, world = eng.loop.time() + timeout, view.ranks[peer]
    eng.send_queue.add(world, x.nbytes)  # not handed to the transport yet: what comm.drain() waits for
    put_off_send(eng, world, functools.partial(_again, eng, view, lane, x, peer, tag, timeout, due, work))


def _again(eng: Engine, view: CommView, lane: Any, x: np.ndarray, peer: int, tag: int, timeout: float, due: float,
           work: Work[None]) -> bool:
    """One try of a put-off send: True once it is sent, handed to the general way, or over."""
    if not work.done():  # (else withdrawn by work.cancel(), or failed by an abort, before it went)
        w = lane.send(x, peer, tag, True)  # (True once sent: this Work is the op's, recorded as it ends)
        if w is False and eng.loop.time() < due:
            return False
        if w is False:
            work._set_exception(CollectiveTimeout(f"send(peer={peer}, tag={tag})", tag, [peer], timeout))
        elif w is None:  # not the lane's any more (closed, aborted, a lost peer): the general way says what became
            coro = send_now(eng, view, peer, tag, byte_view(x), dtype_code(x.dtype), timeout, work, None)
            if coro is not None:
                eng.spawn(coro)
        else:
            work._start_done(None)
    eng.send_queue.done(view.ranks[peer], x.nbytes)
    return True
