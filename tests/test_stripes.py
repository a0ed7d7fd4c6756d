"""Several TCP streams per pair: striping a large frame's payload over stripes, and putting it back.

In-process over socket pairs (the framing and the reassembly), then real ranks over real sockets
(every collective and point-to-point size that is striped, with ``AIOCCL_NSOCKS`` > 1).
"""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest

from aioccl.bootstrap.sockio import tune
from aioccl.errors import InvalidArgument
from aioccl.transport import stripes as stripes_mod
from aioccl.transport.frames import BYE, COLL, Header
from aioccl.transport.pairing import tcp_streams
from aioccl.transport.stripes import ALIGN, STRIPE_MIN, bounds, streams_setting
from aioccl.transport.tcp import TcpConnection

from conftest import launch


def test_bounds_cover_the_payload_on_page_boundaries():
    for nbytes in (STRIPE_MIN, STRIPE_MIN + 1, 3 * STRIPE_MIN + 12345, 64 << 20):
        for parts in (1, 2, 3, 4, 7, 16):
            cuts = bounds(nbytes, parts)
            assert len(cuts) == parts and cuts[0][0] == 0 and cuts[-1][1] == nbytes
            assert all(a[1] == b[0] for a, b in zip(cuts, cuts[1:], strict=False))
            assert all(lo % ALIGN == 0 and hi > lo for lo, hi in cuts)


def test_streams_setting_is_checked():
    assert streams_setting({}) == 1
    assert streams_setting({"AIOCCL_NSOCKS": "4"}) == 4
    for bad in ("0", "17", "two"):
        with pytest.raises(InvalidArgument, match="AIOCCL_NSOCKS"):
            streams_setting({"AIOCCL_NSOCKS": bad})


def test_pairs_agree_on_their_streams():
    """The lower of the two settings, for pairs on different hosts only (a shared-memory pair keeps one)."""
    peers = [{"host": "a", "nsocks": 4, "shm_pair": ""}, {"host": "a", "nsocks": 4, "shm_pair": ""},
             {"host": "b", "nsocks": 2, "shm_pair": ""}, {"host": "c", "nsocks": 3, "shm_pair": "disabled"}]
    got = {(i, j): tcp_streams("auto")(peers, i, j) for i in range(4) for j in range(4) if i != j}
    assert all(got[i, j] == got[j, i] for i, j in got)
    assert got[0, 1] == 1 and got[0, 2] == 2 and got[0, 3] == 3 and got[2, 3] == 2


class Recorder:
    """A sink that lands every frame in a fresh buffer and keeps (header, bytes) in arrival order."""

    def __init__(self) -> None:
        self.frames: list[tuple[Header, bytes]] = []  # in the order they completed
        self.headers: list[int] = []  # frame numbers, in the order their headers came
        self.lost: list[BaseException] = []
        self.arrived = asyncio.Event()

    def on_header(self, peer, h):
        buf = bytearray(h.nbytes)
        self.headers.append(h.k)

        def done():
            self.frames.append((h, bytes(buf)))
            self.arrived.set()
        return memoryview(buf), done

    def on_lost(self, peer, exc, graceful):
        self.lost.append(exc)
        self.arrived.set()


def _pair(stripes: int) -> tuple[list[socket.socket], list[socket.socket]]:
    a, b = zip(*(socket.socketpair() for _ in range(1 + stripes)), strict=True)
    for s in (*a, *b):
        tune(s)
    return list(a), list(b)


def _payload(seed: int, nbytes: int) -> bytes:
    return (np.arange(nbytes, dtype=np.uint64) * 2654435761 + seed).astype(np.uint8).tobytes()


@pytest.mark.parametrize("stripes", [1, 3])
def test_striped_and_small_frames_arrive_whole_and_in_order(stripes):
    sizes = [8, STRIPE_MIN - 1, STRIPE_MIN, 0, 3 * STRIPE_MIN + 4097, 100, 5 * STRIPE_MIN, 1]

    async def main():
        a, b = _pair(stripes)
        sink = Recorder()
        tx = TcpConnection(a[0], 1, Recorder(), stripes=a[1:])
        rx = TcpConnection(b[0], 0, sink, stripes=b[1:])
        rx.start()
        # every frame sent at once, from concurrent tasks: each keeps its header's place on every stream
        await asyncio.gather(*(tx.send(Header(COLL, 1, 1, k, 7, 3, n).pack(), memoryview(_payload(k, n)))
                               for k, n in enumerate(sizes)))
        async with asyncio.timeout(10):
            while len(sink.frames) < len(sizes):
                sink.arrived.clear()
                await sink.arrived.wait()
        assert not sink.lost
        assert sink.headers == list(range(len(sizes)))  # a small frame may complete before a striped one
        assert sorted(h.k for h, _ in sink.frames) == list(range(len(sizes)))
        for h, data in sink.frames:
            assert data == _payload(h.k, sizes[h.k]), f"frame {h.k} of {sizes[h.k]} bytes"
        tx.abort()
        rx.abort()

    asyncio.run(main())


def test_a_goodbye_waits_for_the_last_parts(monkeypatch):
    """A peer that sent a striped frame and closed before this side read anything: the primary stream
    ends (goodbye, then EOF) while the stripes still hold their parts, and those parts still land."""
    monkeypatch.setattr(stripes_mod, "STRIPE_MIN", 64 << 10)  # small enough to sit in the sockets' buffers
    size = 96 << 10

    async def main():
        a, b = _pair(2)
        sink = Recorder()
        tx = TcpConnection(a[0], 1, Recorder(), stripes=a[1:])
        rx = TcpConnection(b[0], 0, sink, stripes=b[1:])
        async with asyncio.timeout(10):
            await tx.send(Header(COLL, 1, 1, 0, 7, 3, size).pack(), memoryview(_payload(5, size)))
            await tx.close(graceful=True)
            rx.start()
            while not sink.lost:
                sink.arrived.clear()
                await sink.arrived.wait()
        assert [data for _, data in sink.frames] == [_payload(5, size)]
        rx.abort()

    asyncio.run(main())


def test_a_goodbye_then_a_lane_cut_short_still_loses_the_connection(monkeypatch):
    """The peer says goodbye but one of its stripes ends before its part is whole: the connection is lost
    (not left waiting for a part that cannot come)."""
    monkeypatch.setattr(stripes_mod, "STRIPE_MIN", 64 << 10)
    size = 96 << 10

    async def main():
        a, b = _pair(1)
        sink = Recorder()
        rx = TcpConnection(b[0], 0, sink, stripes=b[1:])
        cut = bounds(size, 2)
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(5):
            await loop.sock_sendall(a[0], Header(COLL, 1, 1, 0, 7, 3, size).pack() + bytes(cut[0][1])
                                    + Header(BYE, 0, 0, 0, 0, 0, 0).pack())
            await loop.sock_sendall(a[1], bytes(100))  # a part of 48 KiB cut short
            for s in a:
                s.close()
            rx.start()
            while not sink.lost:
                sink.arrived.clear()
                await sink.arrived.wait()
        assert not sink.frames and rx.closed
        rx.abort()

    asyncio.run(main())


def test_a_lane_lost_mid_frame_loses_the_connection():
    async def main():
        a, b = _pair(2)
        sink = Recorder()
        rx = TcpConnection(b[0], 0, sink, stripes=b[1:])
        rx.start()
        h = Header(COLL, 1, 1, 0, 7, 3, 2 * STRIPE_MIN)
        cut = bounds(2 * STRIPE_MIN, 3)
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(5):
            await loop.sock_sendall(a[0], h.pack() + bytes(cut[0][1]))  # header and part 0
            await loop.sock_sendall(a[1], bytes((cut[1][1] - cut[1][0]) // 2))  # half of part 1
            a[2].close()  # and stripe 2 dies
            while not sink.lost:
                sink.arrived.clear()
                await sink.arrived.wait()
        assert not sink.frames and rx.closed
        for s in a:
            s.close()
        rx.abort()

    asyncio.run(main())


@pytest.mark.parametrize("n", [2, 3])
def test_ranks_over_several_streams(n):
    """Every collective and point-to-point message large enough to be striped, exact, on real ranks."""
    proc = launch(n, "stripes.py", env={"AIOCCL_SHM_DISABLE": "1", "AIOCCL_NSOCKS": "3"}, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("stripes ok") == n, proc.stdout[-2000:]
