"""Several TCP streams to one peer: a large message's payload striped across them.

One stream can stop short of what the path carries: a lossy link halves
one congestion window at a time, a NIC spreads its receive work over cores
by flow, a shaper or a switch's hashing may cap each flow. Like NCCL's
``NCCL_NSOCKS_PERTHREAD``, a pair of ranks on different hosts may open
``AIOCCL_NSOCKS`` streams: the connection's own (the *primary*, which
carries every header and every small message) and ``AIOCCL_NSOCKS - 1``
*stripes* that carry nothing but payload bytes.

A frame of ``STRIPE_MIN`` bytes or more is cut into ``1 + stripes`` parts by
``bounds`` (a pure function of its size, so both sides cut alike): part 0
follows the header on the primary, part ``i`` goes on stripe ``i``, with no
header of its own. Each stripe carries the parts of striped frames in the
order their headers went on the primary, so a receiver that read a header
knows where the next bytes of every stripe go: it queues one slice of the
frame's target per stripe, and each stripe's receiving thread reads only the
slices queued (so a stripe's bytes wait in the kernel, not in memory, until
their header arrives). The frame is done when its last part is.
"""

from __future__ import annotations

import asyncio
import os
import queue
import socket
import threading
from collections.abc import Callable, Mapping

from ..envvars import env_int

STRIPE_MIN = 1 << 20  # smaller frames go whole on the primary stream: striping costs a thread handoff per stripe
ALIGN = 4096  # parts start on page boundaries of the target
MAX_STREAMS = 16
DEFAULT_STREAMS = 1  # measured: docs/benchmarks.md, "The socket path"


def streams_setting(env: Mapping[str, str] = os.environ) -> int:
    """``AIOCCL_NSOCKS``: TCP streams per pair of ranks on different hosts (1 to 16)."""
    return env_int(env, "AIOCCL_NSOCKS", DEFAULT_STREAMS, low=1, high=MAX_STREAMS)


def bounds(nbytes: int, parts: int) -> list[tuple[int, int]]:
    """The byte range of each part of a striped frame (the last takes the remainder)."""
    q = nbytes // parts // ALIGN * ALIGN
    cuts = [i * q for i in range(parts)] + [nbytes]
    return [(cuts[i], cuts[i + 1]) for i in range(parts)]


class _Joint:
    """One striped frame being received: calls ``done`` when its last part has landed."""

    __slots__ = ("left", "done")

    def __init__(self, parts: int, done: Callable[[], None]) -> None:
        self.left, self.done = parts, done

    def part_done(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.done()


class StripeSocket:
    """One extra stream, driven by two threads of its own: one receives the parts queued by ``expect``,
    one sends the parts given to ``send``. A thread blocked in ``recv_into`` or ``sendall`` holds no
    GIL, so the copies into and out of the kernel of several stripes (and of the event loop's own
    stream) run on several cores at once, as NCCL's socket helper threads do."""

    def __init__(self, sock: socket.socket, on_error: Callable[[BaseException], None],
                 on_drained: Callable[[], None]) -> None:
        sock.setblocking(True)  # only its threads use it
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.on_error, self.on_drained = on_error, on_drained
        self.pending = 0  # parts queued to receive and not landed yet
        self.dead = False  # lost or closed: nothing landing from here on is reported
        self._inbox: queue.SimpleQueue[tuple[memoryview, _Joint] | None] = queue.SimpleQueue()
        self._outbox: queue.SimpleQueue[tuple[memoryview, asyncio.Future[None]] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    def _start(self) -> None:
        if not self._threads:
            for fn in (self._receiving, self._sending):
                t = threading.Thread(target=fn, name=f"aioccl-stripe-{fn.__name__[1:]}", daemon=True)
                t.start()
                self._threads.append(t)

    def expect(self, view: memoryview, joint: _Joint) -> None:
        self._start()
        self.pending += 1
        self._inbox.put((view, joint))

    def send(self, view: memoryview) -> asyncio.Future[None]:
        """Queue ``view`` for the sending thread now (parts go out in the order queued); the future is
        done once the kernel has taken all of it."""
        self._start()
        fut = self.loop.create_future()
        self._outbox.put((view, fut))
        return fut

    def _receiving(self) -> None:
        while (item := self._inbox.get()) is not None:
            view, joint = item
            got, size = 0, len(view)
            try:
                while got < size:
                    n = self.sock.recv_into(view[got:])
                    if n == 0:  # never a goodbye: the peer's bye waits for its stripes' parts to be read
                        raise ConnectionResetError("a stream closed by the peer mid-message")
                    got += n
            except OSError as e:
                self._tell(self._failed, e)
                return
            self._tell(self._landed, joint)

    def _sending(self) -> None:
        while (item := self._outbox.get()) is not None:
            view, fut = item
            try:
                self.sock.sendall(view)
            except OSError as e:
                self._tell(_settle, fut, e)
                continue
            self._tell(_settle, fut, None)

    def _tell(self, fn: Callable[..., None], *args: object) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    def _landed(self, joint: _Joint) -> None:
        if self.dead:
            return
        self.pending -= 1
        joint.part_done()
        if not self.pending:
            self.on_drained()

    def _failed(self, e: BaseException) -> None:
        if not self.dead:
            self.dead = True
            self.on_error(e)

    def close(self) -> None:
        """Stop (a thread blocked in the kernel is woken by the shutdown) and close."""
        self.dead = True
        self._inbox.put(None)
        self._outbox.put(None)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass


def _settle(fut: asyncio.Future[None], e: BaseException | None) -> None:
    if not fut.done():
        if e is None:
            fut.set_result(None)
        else:
            fut.set_exception(e)


class Stripes:
    """The stripes of one connection: striping on send, reassembly on receive."""

    def __init__(self, socks: list[socket.socket], on_error: Callable[[BaseException], None]) -> None:
        self.stripes = [StripeSocket(s, on_error, self._drained) for s in socks]
        self.parts = 1 + len(self.stripes)
        self.on_idle: Callable[[], None] | None = None  # once every stripe has read all it expects

    def busy(self) -> bool:
        """Are parts of a striped frame still to be read?"""
        return any(stripe.pending and not stripe.dead for stripe in self.stripes)

    def _drained(self) -> None:
        if self.on_idle is not None and not self.busy():
            idle, self.on_idle = self.on_idle, None
            idle()

    def striped(self, nbytes: int) -> bool:
        return nbytes >= STRIPE_MIN

    def receive(self, target: memoryview, done: Callable[[], None]) -> tuple[memoryview, Callable[[], None]]:
        """A striped frame's header was read: queue its stripe parts; returns where part 0 goes."""
        cuts = bounds(len(target), self.parts)
        joint = _Joint(self.parts, done)
        for stripe, (lo, hi) in zip(self.stripes, cuts[1:], strict=True):
            stripe.expect(target[lo:hi], joint)
        lo, hi = cuts[0]
        return target[lo:hi], joint.part_done

    def send(self, payload: memoryview) -> tuple[memoryview, asyncio.Future[list[None]]]:
        """Queue parts 1.. of a striped payload, one per stripe; returns part 0 (for the connection's own
        stream) and the future of the rest. Called under the connection's lock, before the frame's
        header is written, so every stripe carries parts in their headers' order."""
        cuts = bounds(len(payload), self.parts)
        rest = asyncio.gather(*(stripe.send(payload[lo:hi])
                                for stripe, (lo, hi) in zip(self.stripes, cuts[1:], strict=True)))
        return payload[:cuts[0][1]], rest

    def stop(self) -> None:
        """The connection is lost: nothing the stripes receive from here on is reported."""
        for stripe in self.stripes:
            stripe.dead = True

    def close(self) -> None:
        for stripe in self.stripes:
            stripe.close()
