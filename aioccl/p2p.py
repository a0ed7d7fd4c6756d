"""Point-to-point ops: a mixin of ``Communicator``. ``isend`` and ``irecv`` go through the communicator's door
(``lanes/door.py``): the pair lane first, then the general way here (``_general_message``).

Messages match by (peer, tag) in posting order, like MPI; sends may be
posted before their receives (the data waits in a pooled buffer). A receive
from ``ANY_SOURCE`` or with ``ANY_TAG`` takes the earliest message that fits
and no receive posted before it wants; its ``work.status`` says whose it got.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .buffers import adapt, byte_view, need_writable
from .dtypes import dtype_code
from .engine.p2p.probes import Message as Message
from .engine.p2p.starts import start_drain, start_probe, start_recv, start_recv_any, start_send
from .engine.receives import Status as Status
from .errors import InvalidArgument
from .lanes.call import SEND
from .lanes.pair import put_off
from .native.answers import Declined
from .work import Work

if TYPE_CHECKING:
    from .engine.engine import Engine
    from .engine.view import CommView
    from .lanes.call import Call
    from .lanes.door import Door
    from .lanes.pair import PairLane

MAX_TAG = (1 << 62) - 1
ANY_SOURCE = -1  # irecv(peer=ANY_SOURCE): from whichever rank's message comes first
ANY_TAG = -1  # irecv(tag=ANY_TAG): whatever the message's tag
_HOST_STREAM = "stream= orders ops on GPU buffers; this op's buffers are in host memory"


class PointToPointOps:
    # (Communicator's own members, used here: this mixin is a part of it, not a class of its own)
    _view: CommView
    _engine: Engine
    _door: Door
    _pair: PairLane
    _peer: Callable[[int], int]
    _op_timeout: Callable[[float | None], float]
    _usable: Callable[[], None]
    _track: Callable[..., Work[Any]]
    _gpu_p2p: Callable[..., Work[Any]]

    def _put_off(self, x: np.ndarray, peer: int, tag: int) -> Work[None]:
        """A lane send whose FIFO stayed full while the loop was wanted: it goes from the loop, in order with the
        sends to that peer after it (``lanes/pair.put_off``)."""
        work: Work[None] = Work(f"send(peer={peer}, tag={tag})", tag, cancellable=True)
        work._probe = _probe(peer)
        return self._track(work, (x.size, x.dtype, None, None), put_off, self._engine, self._view, self._pair.native,
                           x, peer, tag, self._op_timeout(None), work)

    def _peer_tag(self, peer: int, tag: int) -> tuple[int, int]:
        if type(peer) is int and type(tag) is int and 0 <= peer < self._view.size and 0 <= tag <= MAX_TAG:
            return peer, tag  # the usual call, checked in one line
        if not isinstance(tag, (int, np.integer)) or isinstance(tag, bool):
            raise InvalidArgument(f"tag must be an int in [0, 2**62), got {tag!r} of type {type(tag).__name__}")
        if not 0 <= tag <= MAX_TAG:
            raise InvalidArgument(f"tag must be an int in [0, 2**62) (aioccl.MAX_TAG is the largest), got {tag!r}")
        return self._peer(peer), int(tag)

    def _matching(self, peer: int, tag: int) -> tuple[int, int, bool]:
        """A receive's or probe's (peer, tag), either of which may be ANY_SOURCE / ANY_TAG (True: one is)."""
        if peer == ANY_SOURCE or tag == ANY_TAG:
            return (ANY_SOURCE if peer == ANY_SOURCE else self._peer(peer),
                    ANY_TAG if tag == ANY_TAG else self._peer_tag(0, tag)[1], True)
        return *self._peer_tag(peer, tag), False

    def isend(self, x: Any, peer: int, tag: int = 0, *, timeout: float | None = None,
              stream: Any = None) -> Work[None]:
        """Send ``x`` to ``peer``; done once the data is handed to the transport.

        A payload over ``AIOCCL_P2P_EAGER`` (1 MiB) goes by rendezvous: it leaves only once ``peer`` has
        posted a matching receive, so the send completes then, and its deadline counts until then. To a
        same-host peer whose FIFO is full, the call waits for room while that peer keeps taking messages
        and the event loop has nothing else to run (its sends would otherwise queue in the engine).
        """
        return self._door.send(x, peer, tag, timeout, stream)

    def _send(self, call: Call) -> Work[None]:
        """The general way of a send."""
        x, peer, tag, stream = call.x, call.root, call.tag, call.stream
        t = self._op_timeout(call.timeout)
        self._usable()
        peer, tag = self._peer_tag(peer, tag)
        xb = adapt(x, "x")
        if not isinstance(xb.array, np.ndarray):
            return self._gpu_p2p("send", xb, peer, tag, _nothing, t, stream)
        if stream is not None:
            raise InvalidArgument(_HOST_STREAM)
        arr = xb.array
        work: Work[None] = Work(f"send(peer={peer}, tag={tag})", tag, cancellable=True)
        work._probe = _probe(peer)
        return self._track(work, (arr.size, arr.dtype, None, None), start_send, self._engine, self._view, peer, tag,
                           byte_view(arr), dtype_code(arr.dtype), t, work, None)

    send = isend

    def irecv(self, buf: Any, peer: int, tag: int = 0, *, timeout: float | None = None,
              stream: Any = None) -> Work[Any]:
        """Receive into ``buf`` from ``peer``; sizes and dtypes must match the send exactly.

        ``peer=ANY_SOURCE`` and ``tag=ANY_TAG`` match as MPI's: the receive takes the earliest-arrived
        message that fits and that no receive posted before it takes; ``work.status`` (a ``Status``) then
        names its source and tag. From any source, a crashed rank of the communicator fails it.
        """
        return self._door.recv(buf, peer, tag, timeout, stream)

    def _recv(self, call: Call) -> Work[Any]:
        """The general way of a receive (without spinning again where the pair lane spun for it)."""
        buf, peer, tag, timeout, stream = call.x, call.root, call.tag, call.timeout, call.stream
        spin = not (call.first.__class__ is Declined and call.first.reason == "spun")
        t = self._op_timeout(timeout)
        self._usable()
        peer, tag, wild = self._matching(peer, tag)
        bb = adapt(buf, "buf")
        need_writable(bb, "buf")
        arr = bb.array
        if not isinstance(arr, np.ndarray):
            return self._gpu_p2p("recv", bb, peer, tag, lambda: bb.wrap(arr), t, stream)
        if stream is not None:
            raise InvalidArgument(_HOST_STREAM)
        if wild:
            work: Work[Any] = Work(f"recv(peer={'any' if peer < 0 else peer}, tag={'any' if tag < 0 else tag})",
                                   tag, cancellable=True)
            me, n = self._view.rank, self._view.size
            work._probe = _probe(peer) if peer >= 0 else lambda: [r for r in range(n) if r != me]
        else:
            work = Work(f"recv(peer={peer}, tag={tag})", tag, cancellable=True)
            work._probe = _probe(peer)
            work.status = Status(peer, tag)
        return self._track(work, (arr.size, arr.dtype, None, None), start_recv_any if wild else start_recv,
                           self._engine, self._view, peer, tag, byte_view(arr), dtype_code(arr.dtype), t, work,
                           bb.wrap(arr), spin)

    def _general_message(self, call: Call) -> Work[Any]:
        """The general way of a message (lanes/general.py)."""
        return self._send(call) if call.code == SEND else self._recv(call)

    recv = irecv

    def drain(self, peer: int = ANY_SOURCE, *, timeout: float | None = None) -> Work[None]:
        """Backpressure, as asyncio's ``StreamWriter.drain()``: done once the sends to ``peer`` (default:
        every peer) that wait in the engine, not yet handed to the transport, hold at most
        ``AIOCCL_SEND_QUEUE`` bytes (4 MiB). ``isend`` never waits for its receive; ``await comm.drain(peer)`` after it
        bounds what a sender holds when the peer is slower. Done at once while the peer keeps up; past
        ``timeout`` it raises ``CollectiveTimeout`` naming the peers still behind (the sends run on).
        """
        peer = ANY_SOURCE if peer == ANY_SOURCE else self._peer(peer)
        t = self._op_timeout(timeout)
        self._usable()
        work: Work[None] = Work(f"drain(peer={'any' if peer < 0 else peer})", -1)
        return self._track(work, (0, np.dtype(np.uint8), None, None), start_drain, self._engine, self._view, peer,
                           t, work)

    def probe(self, peer: int = ANY_SOURCE, tag: int = ANY_TAG, *, timeout: float | None = None) -> Work[Message]:
        """Learn the next message's source, tag, dtype and size without receiving it (MPI's ``Probe``).

        The Work gives a ``Message(source, tag, dtype, size, nbytes)`` for the earliest message waiting
        here that fits ``peer`` and ``tag`` (``ANY_SOURCE`` / ``ANY_TAG``: any), or else the next one to
        arrive that no posted receive takes. The message stays: receive it with
        ``comm.irecv(np.empty(m.size, m.dtype), m.source, m.tag)``. Cancelling the await withdraws the probe.
        """
        peer, tag, _wild = self._matching(peer, tag)
        t = self._op_timeout(timeout)
        self._usable()
        work: Work[Message] = Work(f"probe(peer={'any' if peer < 0 else peer}, tag={'any' if tag < 0 else tag})",
                                   tag, cancellable=True)
        me, n = self._view.rank, self._view.size
        work._probe = _probe(peer) if peer >= 0 else lambda: [r for r in range(n) if r != me]
        return self._track(work, (0, np.dtype(np.uint8), None, None), start_probe, self._engine, self._view, peer,
                           tag, t, work)


_PROBES: dict[int, Callable[[], list[int]]] = {}  # one per peer number: bounded by the largest communicator


def _probe(peer: int) -> Callable[[], list[int]]:
    """What a point-to-point op waits for, as ``Communicator.pending()`` asks it (made once per peer)."""
    probe = _PROBES.get(peer)
    if probe is None:
        probe = _PROBES[peer] = lambda: [peer]
    return probe


def _nothing() -> None:
    return None

