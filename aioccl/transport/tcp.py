"""One TCP connection to one peer: framed sends, and a reader that lands payloads in place.

The reader is a readiness callback (``loop.add_reader``) driving a two-state
machine: read a 32-byte header, ask the *sink* (the engine's mailbox) where
the payload goes, read the payload straight into that memory (the user's
array when the receive is already posted, a pooled buffer otherwise), tell
the sink it is done. No task and no future per frame, so a completed receive
wakes its op one loop iteration sooner; no intermediate ``bytes`` objects.
Each callback reads at most ``read_budget`` bytes, so one large payload
cannot starve the sends that share the loop.

Sends hand the header and payload to the kernel in one ``sendmsg`` when they
fit, and wait for the socket to take the rest (zero-copy on memoryviews),
remembering what it has not taken yet: an abort in the middle of a frame
finishes that frame (bounded in time) so that its last words can follow it.
A lock keeps concurrent senders' frames whole.
"""

from __future__ import annotations

import asyncio
import math
import os
import select
import socket
import time

from .. import log
from ..bootstrap.sockio import Closed
from ..envvars import env_float
from .frames import BYE, Header, SaidAbort, abort_words, unpack
from .reader import FrameReader, Sink
from .shm.segment import stop_reader
from .stripes import Stripes

_log = log.get("NET")
# A large payload goes to the kernel a slice at a time, the loop handed back whenever the writes have held
# it WRITE_HOLD_S; a readable event reads at most a budget. On loopback a syscall also runs the peer's side
# of TCP: 1 MiB cost 1.4 ms of CPU. SHARED: the engine runs on the caller's own loop (inline), whose timers
# and tasks wait meanwhile, so pieces stay small (~0.3 ms); PRIVATE: a proxy thread's loop, for throughput
# (small pieces cost a 64 MiB all_reduce 15% over sockets).
SHARED_SLICES = (256 << 10, 512 << 10)  # (write slice, read budget)
PRIVATE_SLICES = (4 << 20, 4 << 20)
WRITE_HOLD_S = 200e-6
SEND_NOW_MAX = 64 << 10  # a larger payload is sent by a task: a remainder the kernel refuses is not copied
DEFAULT_PEER_TIMEOUT = 10.0  # a link may flap for seconds (a switch failing over) and come back
# An abort that finds a frame half sent finishes it within this (all of an engine's connections together) so
# that its last words can go after it: a peer that reads on learns it was an abort, and whose loss caused it,
# instead of blaming this rank for a crash. A peer that does not read in time gets no last words (a crash).
LAST_WORDS_S = 0.2


def peer_timeout(env: dict[str, str] | os._Environ[str] = os.environ) -> float:
    """``AIOCCL_PEER_TIMEOUT``: seconds of silence from a peer's *kernel* before it counts as lost."""
    return env_float(env, "AIOCCL_PEER_TIMEOUT", DEFAULT_PEER_TIMEOUT, low=1, unit="seconds")


def watch_liveness(sock: socket.socket, timeout: float) -> None:
    """Let the kernel declare the peer lost after ``timeout`` s without an acknowledgement.

    A crashed process's kernel closes its sockets at once (EOF here); a dead
    host or a cut link says nothing, so: keepalive probes every second on an
    idle connection, and ``TCP_USER_TIMEOUT`` to fail the connection when data
    or probes stay unacknowledged for ``timeout``. The peer's kernel answers
    both, so a peer that is merely busy (computing, blocked, stopped in a
    debugger) is never declared lost; its ops hit their deadline instead.
    """
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, max(1, int(timeout)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(timeout * 1000))
    except (OSError, AttributeError) as e:  # not Linux: loss of a host is then found by op deadlines
        _log.info("cannot set TCP keepalive/user timeout (%s); a lost host is found by op deadlines only", e)


class TcpConnection:
    """``stripes``: the pair's extra streams (``aioccl.transport.stripes``), none for one stream."""

    def __init__(self, sock: socket.socket, peer: int, sink: Sink, liveness: float | None = None,
                 stripes: list[socket.socket] | None = None) -> None:
        self.sock = sock
        if liveness is not None:
            for s in [sock, *(stripes or ())]:
                if s.family in (socket.AF_INET, socket.AF_INET6):
                    watch_liveness(s, liveness)
        self.peer = peer
        self.sink = sink
        self.liveness = liveness
        self.loop = asyncio.get_running_loop()
        self._lock = asyncio.Lock()
        self.closed = False
        self._reading = False
        self.reader = FrameReader(peer, sink)
        self.stripes = Stripes(stripes, self._lose) if stripes else None
        if self.stripes is not None:
            self.reader.stripe = self.stripes
        self._control = bytearray()  # control frames (failure notices) waiting for the socket
        # the frame being written while the kernel has not taken it all: what is left of the piece being sent,
        # and the rest of the frame after it; abort() finishes it before its last words
        self._unsent: tuple[memoryview, memoryview | None] | None = None
        self._said_bye = False  # a graceful close's BYE went out: abort() then adds no last words
        self.write_slice, self.read_budget = PRIVATE_SLICES  # share_loop() for an engine on the caller's loop
        self._flusher: asyncio.Task[None] | None = None

    def share_loop(self) -> None:
        """The engine runs on the caller's own loop: write and read in small pieces (see SHARED_SLICES)."""
        self.write_slice, self.read_budget = SHARED_SLICES

    def start(self) -> None:
        self.loop.add_reader(self.sock.fileno(), self._on_readable)
        self._reading = True

    async def send(self, header: bytes, payload: memoryview | None) -> None:
        if self.closed:
            raise Closed("connection already closed")
        stripes = self.stripes
        if stripes is not None and payload is not None and stripes.striped(len(payload)):
            await self._send_striped(stripes, header, payload)
            return
        async with self._lock:
            await self._write(header, payload)

    async def _send_striped(self, stripes: Stripes, header: bytes, payload: memoryview) -> None:
        """The header and part 0 on this stream, the other parts on the stripes, all at once. The parts
        are queued to the stripes under this stream's lock, so stripes carry them in their headers' order."""
        async with self._lock:
            first, rest = stripes.send(payload)
            try:
                await self._write(header, first)
            except BaseException:
                rest.cancel()  # the stream is broken: the peer's loss of it fails what waits on it
                raise
        await rest

    async def _write(self, header: bytes, payload: memoryview | None) -> None:
        """One frame, whole (the caller holds the lock)."""
        sock = self.sock
        body = payload if payload is not None and len(payload) else None
        if body is not None and (body.format != "B" or body.ndim != 1):
            body = body.cast("B")
        if self._control:
            await self._flush_control()
        try:  # the header and the payload's first slice in one call: a small frame's one syscall
            sent = sock.sendmsg([header, body[:self.write_slice]] if body is not None else [header])
        except (BlockingIOError, InterruptedError):
            sent = 0
        if sent < len(header):
            await self._sendall(memoryview(header)[sent:], body)
            sent = len(header)
        if body is not None:
            await self._write_rest(body, sent - len(header))
        if self._control:
            await self._flush_control()

    async def _write_rest(self, body: memoryview, done: int) -> None:
        """The rest of a payload, a slice at a time, handing the loop back between slices once this has held
        it ``WRITE_HOLD_S`` (the kernel takes megabytes at once on loopback: a millisecond of copying)."""
        clock = time.perf_counter
        until = clock() + WRITE_HOLD_S
        view = body
        while done < len(view):
            piece = view[done:done + self.write_slice]
            await self._sendall(piece, view[done + len(piece):])
            done += len(piece)
            if done < len(view) and clock() > until:
                self._unsent = (view[done:], None)
                await asyncio.sleep(0)
                self._unsent = None
                until = clock() + WRITE_HOLD_S

    async def _sendall(self, view: memoryview, then: memoryview | None = None) -> None:
        """The loop's ``sock_sendall``, keeping what the kernel has not taken yet (and ``then``, the rest of
        the frame after ``view``) in ``_unsent`` while it waits, for abort() to finish."""
        sock = self.sock
        try:
            n = sock.send(view)
        except (BlockingIOError, InterruptedError):
            n = 0
        if n == len(view):
            return
        rest = view[n:]
        self._unsent = (rest, then)
        fut = self.loop.create_future()
        fd = sock.fileno()

        def on_writable() -> None:
            nonlocal rest
            if fut.done():
                return
            try:
                rest = rest[sock.send(rest):]
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                fut.set_exception(e)
                return
            if len(rest):
                self._unsent = (rest, then)
            else:
                fut.set_result(None)

        self.loop.add_writer(fd, on_writable)
        try:
            await fut
        finally:
            self._unsent = None
            self.loop.remove_writer(fd)

    def send_now(self, header: bytes, payload: memoryview) -> bool:
        """Write a small frame from synchronous code (a task and a loop turn cost more than the message)
        when nothing is queued before it; False to take the ``send`` path. What the kernel does not take
        at once is queued behind it, copied, exactly like a control frame, so frames never interleave."""
        if self.closed or self._lock.locked() or self._control or len(payload) > SEND_NOW_MAX:
            return False
        try:
            sent = self.sock.sendmsg([header, payload] if len(payload) else [header])
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            return False  # ``send`` raises it, as the loss of the peer
        if sent < len(header) + len(payload):
            self._queue((header + bytes(payload))[sent:])
        return True

    def send_control(self, frame: bytes) -> None:
        """Send a small control frame now, from synchronous code (an abort path has no time to await).

        Written at once when no frame is half sent; otherwise queued, and the sender that holds the
        socket writes it right after its own frame, so frames never interleave.
        """
        if self.closed:
            return
        if not self._lock.locked() and not self._control:
            try:
                n = self.sock.send(frame)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError:
                return
            if n == len(frame):
                return
            frame = frame[n:]
        self._queue(frame)

    def _queue(self, rest: bytes) -> None:
        """Bytes the socket did not take, for the next writer (or a flusher task) to send first."""
        self._control += rest
        if self._flusher is None:
            self._flusher = self.loop.create_task(self._flush_soon())

    async def _flush_soon(self) -> None:
        try:
            async with self._lock:
                await self._flush_control()
        except (OSError, Closed):
            pass
        finally:
            self._flusher = None

    async def _flush_control(self) -> None:
        data, self._control = bytes(self._control), bytearray()
        if data and not self.closed:
            await self._sendall(memoryview(data))

    @property
    def bye_received(self) -> bool:
        return self.reader.bye_received

    def _recv(self, view: memoryview) -> int:
        try:
            n = self.sock.recv_into(view)
        except (BlockingIOError, InterruptedError):
            return 0
        if n == 0:
            raise Closed("connection closed by peer")
        return n

    def poll(self) -> None:
        """Read what has arrived, if anything (a receive that spins on the socket)."""
        if self._reading:
            self._on_readable()

    def _on_readable(self) -> None:
        try:
            self.reader.feed(self._recv, self.read_budget)
        except (Closed, OSError, ValueError) as e:
            self._lose(e)
        except Exception as e:  # a bug behind the reader: the stream is unreadable from here on
            _log.exception("internal error reading from rank %d", self.peer)
            self._lose(RuntimeError(f"internal error reading from rank {self.peer}: {e!r}"))

    def _lose(self, e: BaseException) -> None:
        self._stop_reading()
        stripes = self.stripes
        if stripes is not None and stripes.busy() and self.bye_received and isinstance(e, Closed) and not self.closed:
            stripes.on_idle = lambda: self._lose(e)  # a peer that said goodbye: its last parts are still coming
            return
        if stripes is not None:
            stripes.stop()
        if not self.closed:
            self.closed = True
            graceful = self.bye_received and isinstance(e, Closed)
            if self.reader.aborted and not graceful:
                e = SaidAbort(self.reader.lost_first)
            _log.info("connection to rank %d ended: %s", self.peer, e)  # the engine warns, once per peer
            self.sink.on_lost(self.peer, e, graceful)

    def pause_reading(self, paused: bool) -> None:
        """Backpressure from the receiver's budget: while paused the kernel's window fills and the peer's
        sends block (its kernel still acknowledges probes, so the connection stays alive)."""
        if self.closed:
            return
        if paused:
            self._stop_reading()
        elif not self._reading:
            self.loop.add_reader(self.sock.fileno(), self._on_readable)
            self._reading = True

    def peer_paused(self, paused: bool) -> None:
        """The peer stopped reading from us (its budget is spent): no kernel verdict on unacknowledged
        data while it is (a send blocked on it still ends at its op's deadline, naming the peer)."""
        if self.liveness is None or self.closed or self.sock.family not in (socket.AF_INET, socket.AF_INET6):
            return
        for s in [self.sock, *(stripe.sock for stripe in (self.stripes.stripes if self.stripes else ()))]:
            try:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 0 if paused else int(self.liveness * 1000))
            except (OSError, AttributeError):
                pass

    def _stop_reading(self) -> None:
        if self._reading:
            self._reading = False
            stop_reader(self.loop, self.sock.fileno())

    async def close(self, graceful: bool) -> None:
        """Say goodbye (so the peer knows this was no crash) and close."""
        if self.closed:
            return
        if graceful:
            try:
                async with asyncio.timeout(5.0):
                    await self.send(Header(BYE, 0, 0, 0, 0, 0, 0).pack(), None)
                self._said_bye = True
            except (OSError, Closed, TimeoutError):
                pass
        self.abort()

    def abort(self, lost_first: int = -1, until: float | None = None) -> None:
        """Drop the connection, leaving the abort's last words (``abort_words``: with ``lost_first``, the world
        rank whose loss this rank knew of first): at once if no frame is half sent, else after the rest of
        that frame if the socket takes it by ``until`` (``time.monotonic()``; None: now + LAST_WORDS_S)."""
        if not self.closed:
            words = memoryview(bytes(self._control) + (b"" if self._said_bye else abort_words(lost_first)))
            half = self._unsent if self._lock.locked() else None
            if half is None:  # at a frame boundary: one try, no waiting
                try:
                    self.sock.send(words)
                except OSError:
                    pass
            else:
                rest, then = half
                self._finish([rest, *([then] if then is not None else []), words],
                             time.monotonic() + LAST_WORDS_S if until is None else until)
        self.closed = True
        self._stop_reading()
        if self.stripes is not None:
            self.stripes.close()
        try:
            self.sock.close()
        except OSError:
            pass

    def _finish(self, parts: list[memoryview], until: float) -> None:
        """Write ``parts`` whole, waiting for the socket (never past ``until``); what does not go is dropped."""
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLOUT)
        for part in parts:
            while len(part):
                left = until - time.monotonic()
                if left <= 0 or not poller.poll(math.ceil(left * 1000)):
                    return
                try:
                    part = part[self.sock.send(part):]
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    return


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

    def abort(self, lost_first: int = -1, until: float | None = None) -> None:
        self.closed = True
