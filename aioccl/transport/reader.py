"""The reader every stream transport shares: a header, then its payload straight into its target.

A two-state machine over any ``recv_into`` (a socket's, a FIFO's): read the
48-byte header, ask the sink (the engine's mailbox) where the payload goes,
read the payload into that memory (the user's array when its receive is
posted, a pooled buffer otherwise), tell the sink it is done. No task and no
future per frame. Goodbye frames are the transport's business, not the
sink's: they only set ``bye_received``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from .frames import BYE, BYE_ABORT, HEADER_SIZE, P2P, Header, unpack
from .shm.fifo import BLOCKED, HEAD, TAIL, ByteFifo

# a larger message is read in all the same: held in the FIFO it would keep its sender from the next one
LINGER_MAX = 256 << 10


class Sink(Protocol):
    def on_header(self, peer: int, h: Header) -> tuple[memoryview, Callable[[], None]]: ...
    def on_lost(self, peer: int, exc: BaseException, graceful: bool) -> None: ...


class Unclaimed(Protocol):
    def __call__(self, peer: int, h: Header) -> bool: ...


class Striper(Protocol):
    """Where a large frame's parts go when it is striped over several streams (``.stripes``)."""

    def striped(self, nbytes: int) -> bool: ...
    def receive(self, target: memoryview, done: Callable[[], None]) -> tuple[memoryview, Callable[[], None]]: ...


class FrameReader:
    __slots__ = ("peer", "sink", "bye_received", "aborted", "lost_first", "stripe", "lingered", "_scanned", "_hbuf",
                 "_hview", "_view", "_got", "_done")

    def __init__(self, peer: int, sink: Sink) -> None:
        self.peer, self.sink = peer, sink
        self.bye_received = False
        self.aborted = False  # the peer's last words said it called abort(): no crash
        self.lost_first = -1  # ... and the world rank whose loss it knew of first (-1: none)
        self.stripe: Striper | None = None  # a connection's stripes, when it has some
        self.lingered = False  # feed_fifo left messages in the FIFO for the native lane's receives to take
        self._scanned = (0, 0)  # feed_fifo's look ahead: (where the run of those begins, how far it looked)
        self._hbuf = bytearray(HEADER_SIZE)
        self._hview = memoryview(self._hbuf)
        self._view = self._hview  # where the bytes being read go: the header, or a payload target
        self._got = 0
        self._done: Callable[[], None] | None = None  # set while a payload is being read

    def feed(self, recv_into: Callable[[memoryview], int], budget: int) -> int:
        """Read frames while ``recv_into`` gives bytes (0: none now) and ``budget`` lasts; returns the
        budget left. ``ValueError`` for a corrupt header; whatever ``recv_into`` raises passes through."""
        while budget > 0:
            view = self._view
            n = recv_into(view[self._got:])
            if n == 0:
                return budget
            budget -= n
            self._got += n
            if self._got < len(view):
                return budget  # drained; the rest comes later
            self._got = 0
            if self._done is None:
                self._on_header(unpack(self._hbuf))
            else:
                done, self._done, self._view = self._done, None, self._hview
                done()
        return budget

    def feed_fifo(self, fifo: ByteFifo, budget: int, unclaimed: Unclaimed | None = None) -> int:
        """``feed`` from a byte FIFO. A frame published whole (and not wrapping around the FIFO's end)
        is taken straight from the FIFO's memory: its header unpacked in place, its payload copied once,
        the tail moved once. That is a small message's path; the rest goes through ``feed``.

        ``unclaimed(peer, header)``: given, the run of whole point-to-point messages that nothing posted here
        takes, at the end of what is published, stays in the FIFO (``lingered``): nothing behind it waits to
        be read, and the native lane's receives take them in order straight from the FIFO (``lanes/pair.py``)
        instead of from pooled buffers the engine copied them into. A frame that must be read behind them,
        a receive or probe posted here (``Mailbox.on_post``), or the connection's end reads them in."""
        ctl, data, cap = fifo.ctl, fifo.data, fifo.cap
        keep = self._run_start(fifo, unclaimed) if unclaimed is not None and self._done is None and not self._got \
            else None
        self.lingered = False
        while budget > 0 and self._done is None and not self._got:
            tail = ctl[TAIL]
            if keep is not None and tail >= keep:
                self.lingered = ctl[HEAD] > tail
                return budget
            avail, at = ctl[HEAD] - tail, tail % cap
            if avail < HEADER_SIZE or at + HEADER_SIZE > cap:
                break
            h = unpack(data, at)
            end = HEADER_SIZE + h.nbytes
            if avail < end or at + end > cap:
                break
            budget -= end
            if h.kind == BYE:
                ctl[TAIL] = tail + end
                self._bye(h)
                continue
            target, done = self.sink.on_header(self.peer, h)
            if h.nbytes:
                target[:] = data[at + HEADER_SIZE:at + end]
            ctl[TAIL] = tail + end  # after the copy: the producer may now overwrite those bytes
            done()
        if budget <= 0 or ctl[HEAD] == ctl[TAIL]:
            return budget
        return self.feed(fifo.read_into, budget)

    def _run_start(self, fifo: ByteFifo, unclaimed: Unclaimed) -> int:
        """Where the run of whole, unclaimed point-to-point messages at the end of what ``fifo`` has published
        begins (its head: no run). Frames looked at before are not looked at again (``_scanned``, reset by
        ``forget_scan`` when a claim is made); a frame still arriving, or one that must be read, ends a run.
        No run while the sender waits for room in the FIFO: the frame it holds back might be the one this
        rank waits for, so the engine reads everything in (into pooled buffers, as without the lane)."""
        ctl, data, cap = fifo.ctl, fifo.data, fifo.cap
        tail, head = ctl[TAIL], ctl[HEAD]
        if ctl[BLOCKED]:  # the sender waits for room: what it holds back may be what this rank waits for
            return head
        run, pos = self._scanned
        if pos < tail or run < tail:
            run = pos = tail
        while pos < head:
            at = pos % cap
            if head - pos < HEADER_SIZE:
                self._scanned = (pos, pos)
                return head  # a header still coming: everything is read
            wrap = at + HEADER_SIZE - cap  # (a header round the FIFO's end: its two parts)
            h = unpack(data, at) if wrap <= 0 else unpack(bytes(data[at:]) + bytes(data[:wrap]))
            end = pos + HEADER_SIZE + h.nbytes
            if end > head:  # still arriving: it, and the run before it, are read
                self._scanned = (pos, pos)
                return head
            if h.kind != P2P or h.nbytes > LINGER_MAX or not unclaimed(self.peer, h):
                run = end
            pos = end
        self._scanned = (run, pos)
        return run

    def forget_scan(self) -> None:
        """A receive or probe was posted: messages left unclaimed may be claimed now (``_run_start``)."""
        self._scanned = (0, 0)

    def _bye(self, h: Header) -> None:
        if h.op == BYE_ABORT:
            self.aborted = True
            self.lost_first = h.root
        else:
            self.bye_received = True

    def streaming(self) -> bool:
        """Is a payload half read (its sender still writing it)?"""
        return self._done is not None

    def mid_frame(self) -> bool:
        """Is a frame begun and not finished here (a header or a payload half read)?"""
        return self._done is not None or self._got > 0

    def _on_header(self, h: Header) -> None:
        if h.kind == BYE:
            self._bye(h)
            return
        target, done = self.sink.on_header(self.peer, h)
        if h.nbytes:
            if self.stripe is not None and self.stripe.striped(h.nbytes):
                target, done = self.stripe.receive(target, done)  # this stream carries part 0 only
            self._view, self._done = target, done
        else:
            done()


class SideChannel:
    """The sink of the socket kept beside a data path (ib, shared memory): it carries only a goodbye,
    and its end (EOF, or the kernel's keepalive verdict) is the peer's."""

    def __init__(self, what: str, on_end: Callable[[BaseException, bool], None]) -> None:
        self.what, self.on_end = what, on_end

    def on_header(self, peer: int, h: Header) -> tuple[memoryview, Callable[[], None]]:
        raise ValueError(f"unexpected frame on the {self.what} side channel: {h}")

    def on_lost(self, peer: int, exc: BaseException, graceful: bool) -> None:
        self.on_end(exc, graceful)
