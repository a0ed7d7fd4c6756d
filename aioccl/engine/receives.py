"""The two records of a receive: a ``Posted`` receive waiting for its frame, and an ``Early`` frame
waiting for its receive (held in a pooled buffer, copied once the receive is posted).

Either way a frame is checked against what the receiver expects (op, dtype, size) before a byte is
copied, so a mismatched frame fails the receive instead of filling it with the wrong data.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..errors import CollectiveMismatch
from ..transport.frames import Header
from ..work import Work
from .notices import describe
from .pool import BufferPool


class Posted:
    __slots__ = ("target", "fut", "op", "dtype", "what", "work")

    def __init__(self, target: memoryview, fut: asyncio.Future[None], op: int, dtype: int,
                 what: str, work: Work[Any] | None) -> None:
        self.target, self.fut, self.op, self.dtype, self.what, self.work = target, fut, op, dtype, what, work

    def mismatch(self, peer: int, h: Header) -> CollectiveMismatch | None:
        if h.nbytes == len(self.target) and h.op == self.op and (h.dtype == self.dtype or not h.nbytes):
            return None
        return CollectiveMismatch(f"{self.what}: rank {peer} sent {describe(h.op, h.dtype, h.nbytes)}, "
                          f"this rank expected {describe(self.op, self.dtype, len(self.target))}")

    def complete(self) -> None:
        if not self.fut.done():
            self.fut.set_result(None)

    def fail(self, exc: BaseException) -> None:
        if not self.fut.done():
            self.fut.set_exception(exc)
            self.fut.exception()  # its op may have failed already and never await it: no "never retrieved"


class Early:
    """A frame that arrived before its receive was posted."""

    __slots__ = ("peer", "header", "buf", "done", "waiter", "pool")

    def __init__(self, peer: int, header: Header, pool: BufferPool) -> None:
        self.peer, self.header, self.pool = peer, header, pool
        self.buf = pool.acquire(header.nbytes)
        self.done = False
        self.waiter: Posted | None = None

    def view(self) -> memoryview:
        return self.buf.data[: self.header.nbytes]

    def finish(self) -> None:
        self.done = True
        if self.waiter is not None:
            self.deliver(self.waiter)

    def deliver(self, p: Posted) -> None:
        err = p.mismatch(self.peer, self.header)
        if err is not None:
            p.fail(err)
        else:
            p.target[:] = self.view()
            p.complete()
        self.pool.release(self.buf)
