"""Several TCP streams to one peer: a large message's payload striped across them.

One stream can stop short of what the path carries: a lossy link halves
one congestion window at a time, a NIC spreads its receive work over cores
by flow, a shaper or a switch's hashing may cap each flow. Like NCCL's
``NCCL_NSOCKS_PERTHREAD``, a pair of ranks on different hosts may open
``AIOCCL_NSOCKS`` streams: the connection's own (the *primary*, which
carries every header and every small message) and ``AIOCCL_NSOCKS - 1``
*lanes* that carry nothing but payload bytes.

A frame of ``STRIPE_MIN`` bytes or more is cut into ``1 + lanes`` parts by
``bounds`` (a pure function of its size, so both sides cut alike): part 0
follows the header on the primary, part ``i`` goes on lane ``i``, with no
header of its own. Each lane carries the parts of striped frames in the
order their headers went on the primary, so a receiver that read a header
knows where the next bytes of every lane go: it queues one slice of the
frame's target per lane and reads a lane only while its queue has a slice
(so a lane's bytes wait in the kernel, not in memory, until their header
arrives). The frame is done when its last part is.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections import deque
from collections.abc import Callable, Mapping

from ..bootstrap.sockio import Closed
from ..envvars import env_int
from .shm import stop_reader

STRIPE_MIN = 1 << 20  # smaller frames go whole on the primary stream: striping costs a loop turn per lane
ALIGN = 4096  # parts start on page boundaries of the target
MAX_STREAMS = 16
DEFAULT_STREAMS = 1  # measured: see docs/benchmarks.md, "Several streams per pair"
READ_BUDGET = 4 << 20


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


class Lane:
    """One extra stream: a queue of slices to read into, read only while the queue has one."""

    def __init__(self, sock: socket.socket, on_error: Callable[[BaseException], None],
                 on_drained: Callable[[], None]) -> None:
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.on_error, self.on_drained = on_error, on_drained
        self.queue: deque[tuple[memoryview, _Joint]] = deque()
        self.got = 0
        self.reading = False
        self.lock = asyncio.Lock()

    def expect(self, view: memoryview, joint: _Joint) -> None:
        self.queue.append((view, joint))
        if not self.reading:
            self.reading = True
            self.loop.add_reader(self.sock.fileno(), self.on_readable)

    def on_readable(self) -> None:
        budget = READ_BUDGET
        try:
            while self.queue and budget > 0:
                view, joint = self.queue[0]
                try:
                    n = self.sock.recv_into(view[self.got:])
                except (BlockingIOError, InterruptedError):
                    return
                if n == 0:
                    raise Closed("a stream closed by the peer mid-message")
                budget -= n
                self.got += n
                if self.got == len(view):
                    self.queue.popleft()
                    self.got = 0
                    joint.part_done()
        except (OSError, Closed) as e:
            self.stop()
            self.on_error(e)
            return
        if not self.queue:
            self.stop()
            self.on_drained()

    def stop(self) -> None:
        if self.reading:
            self.reading = False
            stop_reader(self.loop, self.sock.fileno())

    def close(self) -> None:
        self.stop()
        self.queue.clear()
        try:
            self.sock.close()
        except OSError:
            pass


class Lanes:
    """The lanes of one connection: striping on send, reassembly on receive."""

    def __init__(self, socks: list[socket.socket], on_error: Callable[[BaseException], None]) -> None:
        self.lanes = [Lane(s, on_error, self._drained) for s in socks]
        self.parts = 1 + len(self.lanes)
        self.order = asyncio.Lock()  # held from a frame's header to its last lane part: lanes stay in order
        self.on_idle: Callable[[], None] | None = None  # once every lane has read all it expects

    def busy(self) -> bool:
        """Are parts of a striped frame still to be read?"""
        return any(lane.queue for lane in self.lanes)

    def _drained(self) -> None:
        if self.on_idle is not None and not self.busy():
            idle, self.on_idle = self.on_idle, None
            idle()

    def striped(self, nbytes: int) -> bool:
        return nbytes >= STRIPE_MIN

    def receive(self, target: memoryview, done: Callable[[], None]) -> tuple[memoryview, Callable[[], None]]:
        """A striped frame's header was read: queue its lane parts; returns where part 0 goes."""
        cuts = bounds(len(target), self.parts)
        joint = _Joint(self.parts, done)
        for lane, (lo, hi) in zip(self.lanes, cuts[1:], strict=True):
            lane.expect(target[lo:hi], joint)
        lo, hi = cuts[0]
        return target[lo:hi], joint.part_done

    async def send_parts(self, payload: memoryview) -> None:
        """Send parts 1.. of a striped payload, one per lane, concurrently (``order`` is held)."""
        loop = asyncio.get_running_loop()
        cuts = bounds(len(payload), self.parts)
        await asyncio.gather(*(loop.sock_sendall(lane.sock, payload[lo:hi])
                               for lane, (lo, hi) in zip(self.lanes, cuts[1:], strict=True)))

    def poll(self) -> None:
        for lane in self.lanes:
            if lane.reading:
                lane.on_readable()

    def close(self) -> None:
        for lane in self.lanes:
            lane.close()
