"""One TCP connection to one peer: framed sends, and a reader that lands payloads in place.

The reader reads a 32-byte header, asks its *sink* (the engine's mailbox)
where the payload should go, and reads the payload straight into that
memory: the user's array when the receive is already posted, a pooled buffer
otherwise. No intermediate ``bytes`` objects on the data path.

Sends hand the header and payload to the kernel in one ``sendmsg`` when they
fit, and fall back to the loop's ``sock_sendall`` (zero-copy on memoryviews)
for the rest. A lock keeps concurrent senders' frames whole.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Protocol

from .. import log
from ..bootstrap.sockio import Closed, recv_exact
from .frames import BYE, HEADER_SIZE, Header, unpack

_log = log.get("NET")


class Sink(Protocol):
    def on_header(self, peer: int, h: Header) -> tuple[memoryview, Callable[[], None]]: ...
    def on_lost(self, peer: int, exc: BaseException, graceful: bool) -> None: ...


class TcpConnection:
    def __init__(self, sock: socket.socket, peer: int, sink: Sink) -> None:
        self.sock = sock
        self.peer = peer
        self.sink = sink
        self.loop = asyncio.get_running_loop()
        self._lock = asyncio.Lock()
        self._reader: asyncio.Task[None] | None = None
        self.closed = False
        self.bye_received = False

    def start(self) -> None:
        self._reader = self.loop.create_task(self._read_loop(), name=f"aioccl-read-{self.peer}")

    async def send(self, header: bytes, payload: memoryview | None) -> None:
        if self.closed:
            raise Closed("connection already closed")
        sock = self.sock
        bufs = [header, payload] if payload is not None and len(payload) else [header]
        async with self._lock:
            try:
                sent = sock.sendmsg(bufs)
            except (BlockingIOError, InterruptedError):
                sent = 0
            for b in bufs:
                n = len(b)
                if sent >= n:
                    sent -= n
                    continue
                await self.loop.sock_sendall(sock, memoryview(b)[sent:])
                sent = 0

    async def _read_loop(self) -> None:
        hbuf = bytearray(HEADER_SIZE)
        hview = memoryview(hbuf)
        sock, sink, peer = self.sock, self.sink, self.peer
        try:
            while True:
                await recv_exact(sock, hview)
                h = unpack(hbuf)
                if h.kind == BYE:
                    self.bye_received = True
                    continue
                target, done = sink.on_header(peer, h)
                if h.nbytes:
                    await recv_exact(sock, target)
                done()
        except asyncio.CancelledError:
            raise
        except (Closed, OSError, ValueError) as e:
            if not self.closed:
                graceful = self.bye_received and isinstance(e, Closed)
                _log.log(20 if graceful else 30, "connection to rank %d ended: %s", peer, e)
                sink.on_lost(peer, e, graceful)
        finally:
            self.closed = True

    async def close(self, graceful: bool) -> None:
        """Say goodbye (so the peer knows this was no crash) and close."""
        if self.closed:
            return
        if graceful:
            try:
                async with asyncio.timeout(5.0):
                    await self.send(Header(BYE, 0, 0, 0, 0, 0, 0).pack(), None)
            except (OSError, Closed, TimeoutError):
                pass
        self.abort()

    def abort(self) -> None:
        self.closed = True
        if self._reader is not None:
            self._reader.cancel()
        try:
            self.sock.close()
        except OSError:
            pass


class SelfConnection:
    """Messages a rank sends to itself (send/recv to self, split-off comms of one)."""

    def __init__(self, rank: int, sink: Sink) -> None:
        self.peer = rank
        self.sink = sink
        self.closed = False

    def start(self) -> None:
        pass

    async def send(self, header: bytes, payload: memoryview | None) -> None:
        h = unpack(header)
        target, done = self.sink.on_header(self.peer, h)
        if h.nbytes and payload is not None:
            target[:] = payload
        done()

    async def close(self, graceful: bool) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True
