"""The point-to-point lane's one owner: ``PairLane.open`` gives a communicator its native ``PairLane`` (C,
``native/src/py/pair_lane.c``) when the engine has shared-memory pairs and the native core is loaded.

``comm.isend(x, peer)`` and ``comm.irecv(buf, peer)`` of a contiguous numpy array to or from a same-host
peer, called on the engine's thread (the inline engine's: the caller's loop) or on another thread while a
proxy thread's engine is idle (borrowed for the call, as ``Placement.borrow``: synchronous code, torch's
backend), then run from the call to the done Work in C while nothing else is in their way: an eager send
whose frame fits the FIFO with nothing queued before it, and a receive whose message is first in the FIFO
(or comes within the pair's spin) with nothing posted or held before it. From 64 KiB a receive that spins
announces its buffer and the send writes the payload straight into it (cross-memory attach: one copy).
Everything else (a rendezvous, a late message, wildcards, probes, a timeout of the call's own, a lost peer)
is the engine's: the lane declines (``Declined``, answers.h) and the general way runs. A send whose FIFO
stays full while the loop is wanted is declined as ``full`` by the native entry and put off here
(``put_off``): tried again through the lane from the loop. It is off (``enabled``) once the communicator is
closed, aborted, shrunk or has lost a rank (``off``), and never made with ``AIOCCL_NATIVE=0``.

Callers outside Python use the same lane and the same borrowing: jax_ext's point-to-point custom calls,
from XLA's thread (``native/src/py/pair_native.c``). A borrower that took what the engine held wakes its
loop (``Placement.wake``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import native
from ..buffers import byte_view
from ..dtypes import dtype_code
from ..engine.mailbox import p2p_key
from ..engine.p2p.put_off import put_off as put_off_send
from ..engine.p2p.starts import send_now
from ..engine.receives import Status
from ..engine.turns import loop_slice_s, loop_waits
from ..envvars import env_int
from ..errors import CollectiveTimeout
from ..group import current_group
from ..native.answers import Declined
from ..transport.shm.pair import ShmPairConnection
from ..work import BORN_DONE_LOCK, Work
from .call import HOST, SEND, TENSOR, Call
from .door import switch_off

if TYPE_CHECKING:
    from ..engine.engine import Engine
    from ..engine.view import CommView
    from ..state import CommState


_OFF, _STREAM, _TIMEOUT = Declined("off"), Declined("stream"), Declined("timeout")
_BUFFERS, _WILDCARD = Declined("buffers"), Declined("wildcard")


def _no_lane(x: Any, peer: Any, tag: Any) -> Declined:
    """The first try where there is no native pair lane."""
    return _OFF


class PairLane:
    """The point-to-point lane of one communicator: ``isend`` and ``irecv`` through the native ``PairLane``.

    ``first_send`` / ``first_recv``: the door's first tries on the caller's own arguments (the native entries,
    or stand-ins that decline ``off``)."""

    name = "pair"
    RULES: tuple[tuple[str, str], ...] = (
        ("off", "no native core, no shared-memory pair in the engine, the peer on another host, or the "
                "communicator is closed, aborted, shrunk or lost a rank"),
        ("timeout", "the call names a timeout of its own"),
        ("stream", "stream= is given"),
        ("buffers", "not a contiguous host array (writable, to receive into) of a supported dtype, or a peer "
                    "or tag out of range"),
        ("wildcard", "ANY_SOURCE or ANY_TAG"),
        ("size", "larger than AIOCCL_P2P_EAGER (a rendezvous)"),
        ("group", "inside comm.group()"),
        ("busy", "something is in the way: sends queued to the peer, receives posted or messages held before it, "
                 "or another thread holds the engine"),
        ("spun", "a receive whose message did not come within the pair's spin"),
    )

    def __init__(self, engine: Engine, state: CommState, put_off: Any) -> None:
        self.native: Any = open_pair_lane(engine, state.view, state.recorder.entries.append)
        self.first_send: Any = self.native.send if self.native is not None else _no_lane
        self.first_recv: Any = self.native.recv if self.native is not None else _no_lane
        self.on = self.native is not None  # (the door's: a native lane, not switched off)
        self._put_off = put_off  # (x, peer, tag) -> the Work of a send put off (full)
        state.on_off(self.off)

    def off(self) -> None:
        switch_off(self)

    def check(self, call: Call) -> Declined | None:
        if not self.on:
            return _OFF
        if call.timeout is not None:
            return _TIMEOUT
        if call.stream is not None:
            return _STREAM
        if call.kind not in (HOST, TENSOR):
            return _BUFFERS
        if call.root == ANY or call.tag == ANY:
            return _WILDCARD
        return None

    def try_call(self, call: Call) -> Work[Any] | Declined:
        """Through the native lane with the record's host view (a CPU tensor's); a send declined as ``full``
        is put off, sent from the loop through this lane."""
        got = call.first
        if got is None or call.kind != HOST:  # (a host array was tried on these very arguments)
            got = call.first = (self.native.send(call.xa, call.root, call.tag) if call.code == SEND
                                else self.native.recv(call.xa, call.root, call.tag, call.x))
        if got.__class__ is Declined and got.reason == "full":
            return self._put_off(call.xa, call.root, call.tag)  # type: ignore[no-any-return]
        return got

    def carry_on(self, handed: Any, call: Call) -> Work[Any]:
        raise AssertionError("the pair lane hands nothing over: what it cannot finish, it declines")


ANY = -1  # (p2p.ANY_SOURCE, p2p.ANY_TAG)


def open_pair_lane(engine: Engine, view: CommView, record: Any) -> Any:
    """The communicator's native PairLane, or None: no native core, or no shared-memory pair in the engine."""
    core, hub = native.core, engine.pair_hub
    if core is None or hub is None:
        return None
    hub.unclaimed = engine.mailbox.unclaimed  # a pump leaves the last message in the FIFO for the lane to take
    return core.PairLane(pair_setup(engine, view, record))


def pair_setup(engine: Engine, view: CommView, record: Any) -> PairSetup:
    """What a communicator's native PairLane is made from (an engine with shared-memory pairs)."""
    hub = engine.pair_hub
    assert hub is not None
    bell = hub.bell.bell
    box = engine.mailbox
    placement = engine.placement
    return PairSetup(
        engine=engine, conns=engine.conns, queued_sends=engine.queued_sends, posted=box.p2p_posted,
        early=box.p2p_early, wild=box.wild.by_ctx, probes=box.probes.waiting, lost=box.lost, key=p2p_key,
        pair_type=ShmPairConnection, ctx=view.ctx, ranks=tuple(view.ranks), rank=view.rank, work_type=Work,
        done_lock=BORN_DONE_LOCK, home=placement, thread_id=placement.thread_id, group_var=current_group,
        record=record, status_type=Status, dtype_code=dtype_code, eager=engine.eager, spin_s=float(hub.spin_s),
        yield_cpu=hub.yield_cpu, bell_fd=bell.sender(),
        bell_addresses=tuple(bell.address(bell.comm_id, w) for w in view.ranks), lock=placement.lock,
        wake=placement.wake, wanted=functools.partial(loop_waits, engine.loop), slice_s=float(loop_slice_s()),
        stall_s=float(stall_s()), put_off=engine.put_off)


@dataclass(frozen=True, slots=True)
class PairSetup:
    """What the native ``PairLane`` is made from, by name (``pair_lane.c`` reads each field and checks its type):
    the engine's connections and its queued sends; the mailbox's point-to-point queues, wildcards, probes and
    lost peers (``posted``, ``early``, ``wild``, ``probes``, ``lost``: the same objects, read in C while nothing
    in Python runs) and its key (``p2p_key``, the one definition, which the lane checks against its own); the
    communicator's ``ctx``, world ``ranks`` and ``rank``; how a Work is made and recorded; the limits and
    clocks (``eager`` bytes, the spin, the loop's slice, the stall before a send is put off); the bells."""

    engine: Any
    conns: dict[Any, Any]
    queued_sends: dict[Any, Any]
    posted: dict[Any, Any]
    early: dict[Any, Any]
    wild: dict[Any, Any]
    probes: list[Any]
    lost: dict[Any, Any]
    key: Callable[[int, int, int], tuple[int, int, int]]
    pair_type: type
    ctx: int
    ranks: tuple[int, ...]
    rank: int
    work_type: type
    done_lock: Any
    home: Any
    thread_id: int | None  # (an int once the engine's loop runs: the lane is made after)
    group_var: Any
    record: Callable[..., Any]
    status_type: type
    dtype_code: Callable[..., int]
    eager: int
    spin_s: float
    yield_cpu: bool
    bell_fd: int
    bell_addresses: tuple[bytes, ...]
    lock: Any
    wake: Any
    wanted: Callable[[], bool]
    slice_s: float
    stall_s: float
    put_off: dict[Any, Any]


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
        full = w.__class__ is Declined and w.reason == "full"
        if full and eng.loop.time() < due:
            return False
        if full:
            work._set_exception(CollectiveTimeout(f"send(peer={peer}, tag={tag})", tag, [peer], timeout))
        elif w.__class__ is Declined:  # not the lane's any more (closed, aborted, a lost peer): the general way
            coro = send_now(eng, view, peer, tag, byte_view(x), dtype_code(x.dtype), timeout, work, None)
            if coro is not None:
                eng.spawn(coro)
        else:
            work._start_done(None)
    eng.send_queue.done(view.ranks[peer], x.nbytes)
    return True
