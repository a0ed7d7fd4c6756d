"""Point-to-point ops: the general way of ``isend`` and ``irecv`` (``Messages``, a part of each
``Communicator``), and ``drain`` and ``probe``. ``isend`` and ``irecv`` go through the communicator's door
(``lanes/door.py``): the pair lane first, then the general way here (``run``).

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
    from .lanes.call import Call
    from .lanes.pair import PairLane
    from .launch import Launcher
    from .state import CommState
    from .tracking import Tracker

MAX_TAG = (1 << 62) - 1
ANY_SOURCE = -1  # irecv(peer=ANY_SOURCE): from whichever rank's message comes first
ANY_TAG = -1  # irecv(tag=ANY_TAG): whatever the message's tag
_HOST_STREAM = "stream= orders ops on GPU buffers; this op's buffers are in host memory"


class Messages:
    """The messages of one communicator (``state``) on ``engine``: followed by ``tracker``; ``pair``: the
    point-to-point lane (a send it put off goes from the loop through it); ``launcher``: GPU buffers' way."""

    def __init__(self, engine: Engine, state: CommState, tracker: Tracker, launcher: Launcher) -> None:
        self._engine = engine
        self._state = state
        self._view = state.view
        self._tracker = tracker
        self._launcher = launcher
        self.pair: PairLane | None = None  # (given once made: it puts sends off through put_off here)

    def peer(self, peer: int) -> int:
        """A peer checked: an int rank of this communicator (``InvalidArgument`` before anything is sent)."""
        n = self._view.size
        if not isinstance(peer, (int, np.integer)) or isinstance(peer, bool):
            raise InvalidArgument(f"peer must be an int (a rank of this communicator, 0..{n - 1}), "
                                  f"got {peer!r} of type {type(peer).__name__}")
        if not 0 <= peer < n:
            raise InvalidArgument(f"peer {peer!r} out of range for a communicator of {n} ranks")
        return int(peer)

    def put_off(self, x: np.ndarray, peer: int, tag: int) -> Work[None]:
        """A lane send whose FIFO stayed full while the loop was wanted: it goes from the loop, in order with the
        sends to that peer after it (``lanes/pair.put_off``)."""
        work: Work[None] = Work(f"send(peer={peer}, tag={tag})", tag, cancellable=True)
        work._probe = _probe(peer)
        assert self.pair is not None
        return self._tracker.track(work, (x.size, x.dtype, None, None), put_off, self._engine, self._view,
                                   self.pair.native, x, peer, tag, self._state.op_timeout(None), work, origin=True)

    def _peer_tag(self, peer: int, tag: int) -> tuple[int, int]:
        if type(peer) is int and type(tag) is int and 0 <= peer < self._view.size and 0 <= tag <= MAX_TAG:
            return peer, tag  # the usual call, checked in one line
        if not isinstance(tag, (int, np.integer)) or isinstance(tag, bool):
            raise InvalidArgument(f"tag must be an int in [0, 2**62), got {tag!r} of type {type(tag).__name__}")
        if not 0 <= tag <= MAX_TAG:
            raise InvalidArgument(f"tag must be an int in [0, 2**62) (aioccl.MAX_TAG is the largest), got {tag!r}")
        return self.peer(peer), int(tag)

    def _matching(self, peer: int, tag: int) -> tuple[int, int, bool]:
        """A receive's or probe's (peer, tag), either of which may be ANY_SOURCE / ANY_TAG (True: one is)."""
        if peer == ANY_SOURCE or tag == ANY_TAG:
            return (ANY_SOURCE if peer == ANY_SOURCE else self.peer(peer),
                    ANY_TAG if tag == ANY_TAG else self._peer_tag(0, tag)[1], True)
        return *self._peer_tag(peer, tag), False

    def _send(self, call: Call) -> Work[None]:
        """The general way of a send."""
        x, peer, tag, stream = call.x, call.root, call.tag, call.stream
        t = self._state.op_timeout(call.timeout)
        self._state.usable()
        peer, tag = self._peer_tag(peer, tag)
        xb = adapt(x, "x")
        if not isinstance(xb.array, np.ndarray):
            return self._launcher.gpu_p2p("send", xb, peer, tag, _nothing, t, stream)
        if stream is not None:
            raise InvalidArgument(_HOST_STREAM)
        arr = xb.array
        work: Work[None] = Work(f"send(peer={peer}, tag={tag})", tag, cancellable=True)
        work._probe = _probe(peer)
        return self._tracker.track(work, (arr.size, arr.dtype, None, None), start_send, self._engine, self._view, peer,
                                   tag, byte_view(arr), dtype_code(arr.dtype), t, work, None, origin=True)

    def _recv(self, call: Call) -> Work[Any]:
        """The general way of a receive (without spinning again where the pair lane spun for it)."""
        buf, peer, tag, timeout, stream = call.x, call.root, call.tag, call.timeout, call.stream
        spin = not (call.first.__class__ is Declined and call.first.reason == "spun")
        t = self._state.op_timeout(timeout)
        self._state.usable()
        peer, tag, wild = self._matching(peer, tag)
        bb = adapt(buf, "buf")
        need_writable(bb, "buf")
        arr = bb.array
        if not isinstance(arr, np.ndarray):
            return self._launcher.gpu_p2p("recv", bb, peer, tag, lambda: bb.wrap(arr), t, stream)
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
        return self._tracker.track(work, (arr.size, arr.dtype, None, None), start_recv_any if wild else start_recv,
                                   self._engine, self._view, peer, tag, byte_view(arr), dtype_code(arr.dtype), t,
                                   work, bb.wrap(arr), spin, origin=True)

    def run(self, call: Call) -> Work[Any]:
        """The general way of a message (lanes/general.py)."""
        return self._send(call) if call.code == SEND else self._recv(call)

    def drain(self, peer: int = ANY_SOURCE, *, timeout: float | None = None) -> Work[None]:
        """``Communicator.drain``: done once the sends to ``peer`` queued in the engine fit ``AIOCCL_SEND_QUEUE``."""
        peer = ANY_SOURCE if peer == ANY_SOURCE else self.peer(peer)
        t = self._state.op_timeout(timeout)
        self._state.usable()
        work: Work[None] = Work(f"drain(peer={'any' if peer < 0 else peer})", -1)
        return self._tracker.track(work, (0, np.dtype(np.uint8), None, None), start_drain, self._engine, self._view,
                                   peer, t, work)

    def probe(self, peer: int = ANY_SOURCE, tag: int = ANY_TAG, *, timeout: float | None = None) -> Work[Message]:
        """``Communicator.probe``: the next message's envelope, the message left where it is."""
        peer, tag, _wild = self._matching(peer, tag)
        t = self._state.op_timeout(timeout)
        self._state.usable()
        work: Work[Message] = Work(f"probe(peer={'any' if peer < 0 else peer}, tag={'any' if tag < 0 else tag})",
                                   tag, cancellable=True)
        me, n = self._view.rank, self._view.size
        work._probe = _probe(peer) if peer >= 0 else lambda: [r for r in range(n) if r != me]
        return self._tracker.track(work, (0, np.dtype(np.uint8), None, None), start_probe, self._engine, self._view,
                                   peer, tag, t, work, origin=True)


_PROBES: dict[int, Callable[[], list[int]]] = {}  # one per peer number: bounded by the largest communicator


def _probe(peer: int) -> Callable[[], list[int]]:
    """What a point-to-point op waits for, as ``Communicator.pending()`` asks it (made once per peer)."""
    probe = _PROBES.get(peer)
    if probe is None:
        probe = _PROBES[peer] = lambda: [peer]
    return probe


def _nothing() -> None:
    return None

