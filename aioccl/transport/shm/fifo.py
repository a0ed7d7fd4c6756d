"""A single-producer, single-consumer byte FIFO in shared memory: the stream under a shared-memory pair.

One FIFO carries one direction of one pair of ranks, and behaves like the
byte stream of a socket: the producer writes whatever fits and publishes it,
the consumer reads whatever has been published. Frames (header + payload)
are laid on it exactly as on TCP, so the same reader state machine serves.

Layout, from ``base``::

    [head: u64][pad to 64]   bytes ever published (written by the producer only)
    [tail: u64][pad to 64]   bytes ever consumed (written by the consumer only)
    [blocked: u64][pad]      1 while the producer waits for space (it wants a bell)
    [watching: u64]          1 while the consumer spins on the FIFO (it needs no bell)
    [quiet: u64]             1 while the consumer's engine waits for no point-to-point message from
                             the producer: the native lane's sends ring no bell for one (``pair.py``)
    [want: 5 u64, claim: u64] a receive spinning in the native lane announces its buffer; its sender
                             writes the payload straight into it (``native/src/core/fifo.h``)
    [data: cap bytes]

Each counter has its own cache line and one writer; an aligned 8-byte store
is atomic on x86, and total store order makes the data visible before the
head that publishes it (shared memory is enabled on x86 only, see
``pair_setup.TSO_MACHINES``).
"""

from __future__ import annotations

import threading

CTRL_BYTES = 256
PUBLISH_EVERY = 128 << 10  # a large frame is published in pieces of this size (see write_frame)
HEAD, TAIL, BLOCKED, WATCHING, QUIET = 0, 8, 16, 24, 25  # u64 indices into the control block
WANT = 26  # (26-31: a waiting receive's buffer and its sender's claim, written and read in C: core/fifo.h)
_fence_lock = threading.Lock()


def fence() -> None:
    """A full memory barrier (x86 lets a later load pass an earlier store): acquiring a lock is an atomic
    read-modify-write."""
    _fence_lock.acquire()
    _fence_lock.release()


def fifo_bytes(cap: int) -> int:
    """Bytes one FIFO of capacity ``cap`` takes in a segment."""
    return CTRL_BYTES + cap


class ByteFifo:
    """One end's view of a FIFO (both ends construct the same view over their own mapping).

    Plain memoryviews, not numpy: a frame of a small message is a few dozen bytes, and a memoryview
    slice assignment copies them in a fraction of the time numpy takes to set up a copy (large
    copies are one ``memcpy`` either way)."""

    __slots__ = ("ctl", "data", "cap")

    def __init__(self, buf: memoryview | bytearray, base: int, cap: int) -> None:
        if cap <= 0 or cap % 64:
            raise ValueError(f"FIFO capacity must be a positive multiple of 64, got {cap}")
        mv = memoryview(buf).cast("B")
        self.ctl = mv[base:base + CTRL_BYTES].cast("Q")
        self.data = mv[base + CTRL_BYTES:base + CTRL_BYTES + cap]
        self.cap = cap

    def release(self) -> None:
        """Let go of the shared memory (so its mapping can be closed): the FIFO is then empty and full."""
        ctl, data = self.ctl, self.data
        self.ctl = memoryview(bytearray(CTRL_BYTES)).cast("Q")
        self.data = memoryview(bytearray(0))
        self.cap = 0
        ctl.release()
        data.release()

    # -- producer ------------------------------------------------------------
    def free(self) -> int:
        ctl = self.ctl
        return self.cap - (ctl[HEAD] - ctl[TAIL])

    def write(self, src: memoryview) -> int:
        """Copy as much of ``src`` (bytes, flat) as fits and publish it; returns the bytes written (0: full)."""
        ctl = self.ctl
        head = ctl[HEAD]
        n = min(len(src), self.cap - (head - ctl[TAIL]))
        if n <= 0:
            return 0
        ctl[HEAD] = self._put(head, src[:n] if n < len(src) else src)  # after the data, as in write_frame
        return n

    def write_frame(self, header: bytes, payload: memoryview) -> None:
        """Copy a whole frame that fits (the caller checked ``free()``) and publish it: a small one at
        once, a large one piece by piece (``PUBLISH_EVERY``), so the consumer copies each piece out
        while the next one comes in."""
        ctl = self.ctl
        head = self._put(ctl[HEAD], header)
        n = len(payload)
        if n <= PUBLISH_EVERY:
            ctl[HEAD] = self._put(head, payload)  # after the data: a consumer that sees the head sees the bytes
            return
        ctl[HEAD] = head
        for start in range(0, n, PUBLISH_EVERY):
            head = self._put(head, payload[start:start + PUBLISH_EVERY])
            ctl[HEAD] = head

    def _put(self, head: int, part: bytes | memoryview) -> int:
        """Copy ``part`` into the FIFO at ``head`` (wrapping around its end); returns the new head,
        not yet published."""
        n, cap = len(part), self.cap
        at = head % cap
        first = min(n, cap - at)
        self.data[at:at + first] = part[:first]
        if first < n:
            self.data[:n - first] = part[first:n]
        return head + n

    def set_blocked(self, on: bool) -> None:
        self.ctl[BLOCKED] = 1 if on else 0

    def consumer_watching(self) -> bool:
        """After a fence that follows the publish: True if the consumer will see the bytes without a bell."""
        return bool(self.ctl[WATCHING])

    # -- consumer ------------------------------------------------------------
    def available(self) -> int:
        ctl = self.ctl
        return ctl[HEAD] - ctl[TAIL]

    def read_into(self, dst: memoryview) -> int:
        """Copy up to ``len(dst)`` published bytes into ``dst`` (bytes, flat) and free them; returns the
        count (0: empty)."""
        ctl, cap = self.ctl, self.cap
        tail = ctl[TAIL]
        n = min(len(dst), ctl[HEAD] - tail)
        if n <= 0:
            return 0
        at = tail % cap
        first = min(n, cap - at)
        dst[:first] = self.data[at:at + first]
        if first < n:
            dst[first:n] = self.data[:n - first]
        ctl[TAIL] = tail + n  # after the copy: the producer may now overwrite those bytes
        return n

    def producer_blocked(self) -> bool:
        return bool(self.ctl[BLOCKED])

    def set_watching(self, on: bool) -> None:
        """While on, the producer skips the bell; after turning it off, fence and read once more."""
        self.ctl[WATCHING] = 1 if on else 0
