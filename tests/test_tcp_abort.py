"""An abort over TCP in the middle of a large frame: the peer still learns it was an abort, and why.

A rank that aborts because it lost another rank says so in its last words (``abort_words``), so that its peers
blame the rank that died, not the one that reported it. Its last words cannot go in the middle of a frame: the
abort finishes that frame first, within a bounded time. In-process, over a socket pair.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time

from aioccl.bootstrap.sockio import tune
from aioccl.transport.frames import COLL, Header, SaidAbort
from aioccl.transport.tcp import TcpConnection

SIZE = 8 << 20  # far past what a socket pair's buffers hold: the send waits in the middle of its frame


class Sink:
    """Lands every frame in a fresh buffer; keeps the frames and the loss."""

    def __init__(self) -> None:
        self.frames: list[tuple[Header, bytes]] = []
        self.lost: list[BaseException] = []
        self.ended = asyncio.Event()

    def on_header(self, peer, h):
        buf = bytearray(h.nbytes)
        return memoryview(buf), lambda: self.frames.append((h, bytes(buf)))

    def on_lost(self, peer, exc, graceful):
        self.lost.append(exc)
        self.ended.set()


def _pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    for s in (a, b):
        tune(s)
    return a, b


async def _half_sent(tx: TcpConnection, payload: bytes) -> asyncio.Task[None]:
    send = asyncio.create_task(tx.send(Header(COLL, 1, 1, 0, 7, 3, SIZE).pack(), memoryview(payload)))
    for _ in range(20):  # a few turns of the loop: the socket takes what its buffers hold, then waits
        await asyncio.sleep(0.005)
    assert not send.done()
    return send


def _drain(sock: socket.socket, into: bytearray) -> None:
    sock.setblocking(True)
    while chunk := sock.recv(1 << 20):
        into += chunk


def _write(sock: socket.socket, data: bytes) -> None:
    sock.setblocking(True)
    sock.sendall(data)
    sock.close()


def test_an_abort_in_the_middle_of_a_frame_finishes_it_and_its_last_words_name_the_rank_lost():
    payload = (bytes(range(251)) * (SIZE // 251 + 1))[:SIZE]  # every byte's place shows

    async def main():
        a, b = _pair()
        tx = TcpConnection(a, 1, Sink())
        send = await _half_sent(tx, payload)
        got = bytearray()
        reader = threading.Thread(target=_drain, args=(b, got))
        reader.start()  # the peer reads on while this side aborts
        tx.abort(lost_first=2)
        reader.join(10)
        assert not reader.is_alive()
        send.cancel()
        with contextlib.suppress(BaseException):
            await send
        b.close()
        # what the peer read, read again by a connection: the frame whole, then an abort that names rank 2
        c, d = _pair()
        sink = Sink()
        rx = TcpConnection(d, 0, sink)
        writer = threading.Thread(target=_write, args=(c, bytes(got)))
        writer.start()
        rx.start()
        async with asyncio.timeout(10):
            await sink.ended.wait()
        rx.abort()
        writer.join(10)
        assert [(h.nbytes, data == payload) for h, data in sink.frames] == [(SIZE, True)]
        assert len(sink.lost) == 1 and isinstance(sink.lost[0], SaidAbort), sink.lost
        assert sink.lost[0].lost_first == 2

    asyncio.run(main())


def test_an_abort_whose_peer_does_not_read_gives_up_its_last_words_at_its_deadline():
    """The peer reads nothing: the abort returns by its deadline, and the peer sees the frame cut short."""
    payload = bytes(SIZE)

    async def main():
        a, b = _pair()
        tx = TcpConnection(a, 1, Sink())
        send = await _half_sent(tx, payload)
        t0 = time.monotonic()
        tx.abort(lost_first=2, until=t0 + 0.05)
        took = time.monotonic() - t0
        send.cancel()
        with contextlib.suppress(BaseException):
            await send
        sink = Sink()
        rx = TcpConnection(b, 0, sink)
        rx.start()
        async with asyncio.timeout(10):
            await sink.ended.wait()
        rx.abort()
        assert took < 2.0  # (0.05 s asked; the margin is for a busy machine)
        assert not sink.frames and len(sink.lost) == 1 and not isinstance(sink.lost[0], SaidAbort), sink.lost

    asyncio.run(main())
