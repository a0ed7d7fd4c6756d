"""One same-host peer over shared memory: the frame transport of ``tcp.py``, moved through two byte FIFOs.

Each direction of the pair is a ``ByteFifo`` in the *receiver's* segment.
``send`` writes header and payload into the FIFO as the bytes fit (a payload
larger than the FIFO streams through it, so a pair's memory is the FIFO's
size whatever the message), and rings the receiver's bell. The receiver's
bell wakes the ``PairHub``, which pumps every FIFO of the process through the
same two-state reader as TCP: read a header, ask the sink (the mailbox) where
the payload goes, copy it there, tell the sink it is done.

A sender that finds the FIFO full marks it *blocked* and waits; the reader
rings the sender's bell when it frees space in a blocked FIFO. Both sides
also re-check every ``POLL_S`` while they wait, so a wake-up lost to store
reordering between the flag and the counters costs a millisecond, never a
hang.

The pair's bootstrap socket stays open beside the FIFOs as a side channel,
as for ib: it carries the goodbye, and its end (EOF, or the kernel's verdict)
reports a crashed peer at once. Before a loss is reported the FIFOs are
drained, so frames the peer wrote before it went (a failure notice, the last
data of a graceful close) are never overtaken by the news of its end.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

from ... import log
from ...bootstrap.sockio import Closed
from ..cma import PeerMemory
from ..frames import BYE, Header, SaidAbort, abort_words
from ..reader import FrameReader, SideChannel, Sink, Unclaimed
from ..tcp import TcpConnection
from .fifo import BLOCKED, HEAD, QUIET, TAIL, WATCHING, ByteFifo, fence
from .segment import LoopBell, Segment

_log = log.get("SHM")
POLL_S = 0.001
READ_BUDGET = 4 << 20


def bell_address(comm_id: int, rank: int) -> bytes:
    return f"\0aioccl-pair-{comm_id & (2**64 - 1):016x}-{rank}".encode()


class PairHub:
    """This rank's bell for all its shared-memory pairs: a wake-up pumps every inbound FIFO and
    releases every sender that waits for space."""

    def __init__(self, loop: asyncio.AbstractEventLoop, comm_id: int, rank: int) -> None:
        self.loop = loop
        self.bell = LoopBell(loop, comm_id, rank, bell_address)
        self.bell.listeners.append(self._on_bell)
        self.conns: list[ShmPairConnection] = []
        self.spin_s = 0.0  # how long a receive may spin on a FIFO before it waits for the bell
        self.yield_cpu = True  # and whether it yields the CPU between looks (shm.wait_policy)
        self.segment: Segment | None = None  # mine, holding my inbound FIFOs; closed with the hub
        # given (the native point-to-point lane is on): a pump leaves the messages at the end of a FIFO that
        # nothing posted takes (FrameReader.feed_fifo), for the lane's receives to take from there
        self.unclaimed: Unclaimed | None = None

    def start(self) -> None:
        self.bell.start()

    def ring(self, rank: int) -> None:
        self.bell.ring(rank)

    def _on_bell(self) -> None:
        for c in list(self.conns):
            c.pump()
            c.wake_sender()

    def read_left(self, peer: int) -> None:
        """A receive or probe was posted for world rank ``peer`` (-1: any): read in what a FIFO from it still
        holds for the native lane (``unclaimed``), so the engine's matching sees it. A FIFO the lane made
        *quiet* (its peer's lane sends ring no bell: nothing here waited for a message) is loud again first:
        cleared, fence, read, so a frame whose sender saw it quiet is read here (Dekker, as ``_notify``)."""
        for c in list(self.conns):
            if peer >= 0 and c.peer != peer:
                continue
            ctl = c.rx.ctl
            if ctl[QUIET]:
                ctl[QUIET] = 0
                fence()
            elif not c.reader.lingered:
                continue
            c.reader.forget_scan()
            c.pump()

    def describe(self) -> list[str]:
        """Each inbound FIFO's control words and its reader's state, for the hang dump (watchdog.py): whether a
        frame waits unread, and whether its sender would have rung."""
        lines = []
        for c in self.conns:
            ctl, r = c.rx.ctl, c.reader
            lines.append(f"from rank {c.peer}: head {int(ctl[HEAD])} tail {int(ctl[TAIL])} blocked {int(ctl[BLOCKED])} "
                         f"watching {int(ctl[WATCHING])} quiet {int(ctl[QUIET])}; reader got {r._got} "
                         f"mid-payload {r.streaming()} lingered {r.lingered} scanned {r._scanned}; "
                         f"closed {c.closed} paused {c.paused}")
        return lines

    def close(self) -> None:
        self.bell.close()
        for c in list(self.conns):
            c._shut()
        if self.segment is not None:
            self.segment.close()
            self.segment = None


class ShmPairConnection:
    def __init__(self, hub: PairHub, peer: int, sink: Sink, sock: socket.socket, tx: ByteFifo, rx: ByteFifo,
                 liveness: float | None, segment: Segment | None = None) -> None:
        self.hub, self.peer, self.sink, self.tx, self.rx = hub, peer, sink, tx, rx
        self.loop = hub.loop
        self.side = TcpConnection(sock, peer, SideChannel("shared-memory", self._side_ended), liveness)
        self.segment = segment  # the peer's, holding my outbound FIFO: closed when this connection ends
        self.closed = False
        self.paused = False  # by the receiver's budget (pause_reading)
        self._lock = asyncio.Lock()
        self._space = asyncio.Event()  # set by the reader's bell when it freed space in a blocked FIFO
        self._waiting = False
        self._control = bytearray()
        self._said_bye = False
        self.reader = FrameReader(peer, sink)
        self.memory: PeerMemory | None = None  # reads the peer's memory in place, where the kernel lets us
        self._room: Callable[[], None] | None = None  # sends to the peer wait for room from the loop (put_off)

    def start(self) -> None:
        self.side.start()
        self.hub.conns.append(self)
        self.hub.start()
        self.pump()  # frames the peer sent before this side was ready

    # -- sending ---------------------------------------------------------------
    async def send(self, header: bytes, payload: memoryview | None) -> None:
        if self.closed:
            raise Closed("connection already closed")
        async with self._lock:
            if self._control:
                await self._write(memoryview(self._take_control()))
            await self._write(memoryview(header))
            if payload is not None and len(payload):
                await self._write(_bytes(payload))
            if self._control:
                await self._write(memoryview(self._take_control()))
            self._notify()  # once per frame: the reader wakes to a whole frame, not its header

    def send_now(self, header: bytes, payload: memoryview) -> bool:
        """Write a whole frame now, from synchronous code, if nothing is queued before it and it fits."""
        if self.closed or self._lock.locked() or self._control or self.tx.free() < len(header) + len(payload):
            return False
        self.tx.write_frame(header, _bytes(payload))
        self._notify()
        return True

    def _notify(self) -> None:
        """Ring the peer's bell, unless it is spinning on this FIFO: then it sees the frame anyway, and a
        bell would only cost a system call here and a wake-up there (Dekker: publish, fence, look)."""
        fence()
        if not self.tx.consumer_watching():
            self.hub.ring(self.peer)

    def watch(self, on: bool) -> None:
        """This rank spins on the inbound FIFO (``on``), or stops; after stopping, it reads what came."""
        self.rx.set_watching(on)
        if not on:
            fence()
            if self.rx.available():
                self.pump()

    async def _write(self, buf: memoryview) -> None:
        off = 0
        while off < len(buf):
            n = self.tx.write(buf[off:])
            if n:
                off += n
                continue
            await self._wait_for_space()

    async def _wait_for_space(self) -> None:
        if self.closed:
            raise Closed("connection closed while sending")
        self._space.clear()
        self._waiting = True
        self.tx.set_blocked(True)
        fence()  # the flag, then the bell: the reader sees it waits (and reads in what it left for the lane)
        self.hub.ring(self.peer)  # the FIFO is full: the reader must drain it before more fits
        try:
            if self.tx.free() == 0:  # re-check after raising the flag: the reader may have just freed space
                try:
                    await asyncio.wait_for(self._space.wait(), POLL_S)
                except TimeoutError:
                    pass
        finally:
            self.tx.set_blocked(self._room is not None)
            self._waiting = False
        if self.closed:
            raise Closed("connection closed while sending")

    def put_off(self, room: Callable[[], None] | None) -> None:
        """Sends to the peer wait for room from the loop (``engine/p2p/put_off.py``; ``room``: called when the
        peer's bell says it took a frame), or none do any more (None). While they wait, the FIFO says its sender
        is blocked, so the peer's reader reads in what its lane left in the FIFO (what this rank waits for may be
        behind it, as with the engine's own sends) and rings when it frees room; a bell makes it look now."""
        self._room = room
        if room is not None:
            self.tx.set_blocked(True)
            fence()
            self.hub.ring(self.peer)
        elif not self._waiting:
            self.tx.set_blocked(False)

    def wake_sender(self) -> None:
        if self._waiting and self.tx.free():
            self._space.set()
        if self._room is not None and self.tx.free():
            self._room()

    def send_control(self, frame: bytes) -> None:
        """A small control frame, now if no frame is half written and it fits, else right after the current one."""
        if self.closed:
            return
        if not self._lock.locked() and not self._control and self.tx.free() >= len(frame):
            self.tx.write(memoryview(frame))
            self.hub.ring(self.peer)
            return
        self._control += frame
        if not self._lock.locked():
            self.loop.create_task(self._flush_control())

    async def _flush_control(self) -> None:
        try:
            async with self._lock:
                if self._control and not self.closed:
                    await self._write(memoryview(self._take_control()))
                    self.hub.ring(self.peer)
        except Closed:
            pass

    def _take_control(self) -> bytes:
        data, self._control = bytes(self._control), bytearray()
        return data

    # -- receiving -------------------------------------------------------------
    def pause_reading(self, paused: bool) -> None:
        """Backpressure from the receiver's budget: while paused the FIFO fills and the peer's sends wait."""
        self.paused = paused
        if not paused:
            self.pump()

    def pump(self, everything: bool = False) -> None:
        """Read what the peer has published: headers, then payloads straight into their targets (all of it
        with ``everything``; else the last frame may stay for the native lane: ``PairHub.unclaimed``)."""
        if self.closed or self.paused:
            return
        ctl = self.rx.ctl
        before = ctl[HEAD] != ctl[TAIL]
        try:
            budget = self.reader.feed_fifo(self.rx, READ_BUDGET, None if everything else self.hub.unclaimed)
        except ValueError as e:  # a corrupt header: the stream cannot be trusted any more
            self._ended(e, False)
            return
        except Exception as e:  # a bug behind the reader: likewise
            _log.exception("internal error reading from rank %d", self.peer)
            self._ended(RuntimeError(f"internal error reading from rank {self.peer}: {e!r}"), False)
            return
        if self.reader.bye_received:
            self.side.reader.bye_received = True
        if ctl[QUIET] and self.reader.mid_frame():
            # The lane made this FIFO quiet (the sender's lane rings no bell: nothing here waited for a message),
            # but this reader has now begun a frame whose sender is still writing it, and reads the rest only
            # when a bell says it came: loud again, fence, read once more (Dekker, as read_left). Quiet left on,
            # the rest came without a bell and a receive matched to that frame waited forever (issue 75's
            # ppermute hang, found by make stress).
            ctl[QUIET] = 0
            fence()
            self.pump(everything)
        if before and ctl[BLOCKED]:  # it waits for the space just freed
            self.hub.ring(self.peer)
        if budget <= 0:
            self.loop.call_soon(self.pump)  # more is there; let other callbacks run first

    # -- ending ----------------------------------------------------------------
    def _side_ended(self, exc: BaseException, graceful: bool) -> None:
        self.pump(everything=True)  # what the peer wrote before it went comes first
        self._ended(exc, graceful or self.side.bye_received)

    def _ended(self, exc: BaseException, graceful: bool) -> None:
        if self.closed:
            return
        if not graceful and (self.reader.aborted or self.side.reader.aborted):
            exc = SaidAbort(max(self.reader.lost_first, self.side.reader.lost_first))
        self._shut()
        self.side.abort()
        _log.info("connection to rank %d ended: %s", self.peer, exc)  # the engine warns, once per peer
        self.sink.on_lost(self.peer, exc, graceful)

    def _shut(self) -> None:
        self.closed = True
        if self in self.hub.conns:
            self.hub.conns.remove(self)
        self._space.set()
        self.tx.release()
        self.rx.release()
        if self.segment is not None:
            self.segment.close()
            self.segment = None

    async def close(self, graceful: bool) -> None:
        """Say goodbye on the side channel (so the peer knows this was no crash) and close."""
        if self.closed:
            return
        if graceful:
            try:
                async with asyncio.timeout(5.0):
                    async with self._lock:
                        await self._write(memoryview(Header(BYE, 0, 0, 0, 0, 0, 0).pack()))
                        self.hub.ring(self.peer)
                        self._said_bye = True
            except (OSError, Closed, TimeoutError):
                pass
            await self.side.close(graceful=True)
        self.abort()

    def abort(self, lost_first: int = -1, until: float | None = None) -> None:
        if not self._lock.locked() and not self.closed:  # last words: one try, no waiting
            data = self._take_control() + (b"" if self._said_bye else abort_words(lost_first))
            if self.tx.free() >= len(data):
                self.tx.write(memoryview(data))
                self.hub.ring(self.peer)
        self._shut()
        self.side.abort(lost_first, until)


def _bytes(payload: memoryview) -> memoryview:
    """A flat byte view, so the FIFO can slice it where a frame's bytes stop fitting."""
    return payload if payload.format == "B" and payload.ndim == 1 else payload.cast("B")
