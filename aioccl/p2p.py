"""Point-to-point ops: a mixin of ``Communicator``.

Messages match by (peer, tag) in posting order, like MPI; sends may be
posted before their receives (the data waits in a pooled buffer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .buffers import Buf, adapt, byte_view, need_writable
from .dtypes import dtype_code
from .engine.point_to_point import start_recv, start_send
from .errors import InvalidArgument
from .work import Work

if TYPE_CHECKING:
    from .engine.engine import Engine
    from .engine.view import CommView

MAX_TAG = (1 << 62) - 1


class PointToPointOps:
    if TYPE_CHECKING:
        _view: CommView
        _engine: Engine

        def _peer(self, peer: int) -> int: ...

        def _op_timeout(self, timeout: float | None) -> float: ...

        def _usable(self) -> None: ...

        def _track(self, work: Work[Any], start: Callable[[], Any], desc: Any) -> Work[Any]: ...

        def _gpu_p2p(self, kind: str, buf: Buf, peer: int, tag: int, result: Callable[[], Any], timeout: float,
                     stream: Any) -> Work[Any]: ...

    def _tag(self, tag: int) -> int:
        if not isinstance(tag, (int, np.integer)) or not 0 <= tag <= MAX_TAG:
            raise InvalidArgument(f"tag must be an int in [0, 2**62), got {tag!r}")
        return int(tag)

    def isend(self, x: Any, peer: int, tag: int = 0, *, timeout: float | None = None,
              stream: Any = None) -> Work[None]:
        """Send ``x`` to ``peer``; done once the data is handed to the transport.

        A payload over ``AIOCCL_P2P_EAGER`` (1 MiB) goes by rendezvous: it leaves only once ``peer`` has
        posted a matching receive, so the send completes then, and its deadline counts until then.
        """
        peer, tag = self._peer(peer), self._tag(tag)
        xb = adapt(x, "x")
        t = self._op_timeout(timeout)
        self._usable()
        if xb.device is not None:
            return self._gpu_p2p("send", xb, peer, tag, lambda: None, t, stream)
        _host_only(stream)
        work: Work[None] = Work(f"send(peer={peer}, tag={tag})", tag, cancellable=True)
        view, eng, code = self._view, self._engine, dtype_code(xb.array.dtype)
        payload = byte_view(xb.array)
        work._probe = lambda: [peer]
        desc = (xb.array.size, xb.array.dtype, None, None)
        return self._track(work, lambda: start_send(eng, view, peer, tag, payload, code, t, work, None), desc)

    send = isend

    def irecv(self, buf: Any, peer: int, tag: int = 0, *, timeout: float | None = None,
              stream: Any = None) -> Work[Any]:
        """Receive into ``buf`` from ``peer``; sizes and dtypes must match the send exactly."""
        peer, tag = self._peer(peer), self._tag(tag)
        bb = adapt(buf, "buf")
        need_writable(bb, "buf")
        t = self._op_timeout(timeout)
        self._usable()
        if bb.device is not None:
            return self._gpu_p2p("recv", bb, peer, tag, lambda: bb.wrap(bb.array), t, stream)
        _host_only(stream)
        work: Work[Any] = Work(f"recv(peer={peer}, tag={tag})", tag, cancellable=True)
        view, eng, code = self._view, self._engine, dtype_code(bb.array.dtype)
        target = byte_view(bb.array)
        work._probe = lambda: [peer]
        desc = (bb.array.size, bb.array.dtype, None, None)
        return self._track(work, lambda: start_recv(eng, view, peer, tag, target, code, t, work,
                                                       bb.wrap(bb.array)), desc)

    recv = irecv



def _host_only(stream: Any) -> None:
    if stream is not None:
        raise InvalidArgument("stream= orders ops on GPU buffers; this op's buffers are in host memory")
