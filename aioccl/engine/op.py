"""The one record of a collective in flight, on every path (sockets, shared memory, GPU).

Made by the communicator when the op is issued, it carries everything that
identifies the op to the user and to its peers, so a failure can name it
wherever it happens: the sequence number, the *fingerprint* (op, dtype,
reduction, count, root) that every frame and every shared-memory descriptor
carries and that peers compare to find a mismatch, the deadline, the
flight-recorder description, and the ``Work`` it completes. The executor
keeps its own state on it (where it waits), so the deadline can say whom it
waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Generator
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from ..algorithms.schedule import IN, OUT, Region, Schedule
from ..dtypes import ReduceOp
from ..work import Work
from .notices import Fingerprint

A = TypeVar("A")
Wait = tuple[tuple[int, ...], int]  # shared memory: (channel ranks, the step they must have published)
NO_SCHEDULE = Schedule(())
_EMPTY = np.zeros(0, np.uint8)  # a program's buffer that is no buffer (a barrier's)


class Lockstep(Protocol):
    """What an op asks of the shared-memory channel that runs it (``ShmChannel``, which imports this module)."""

    def missing(self, ranks: tuple[int, ...], s: int) -> list[int]:
        """Of ``ranks``, those that have not yet published step ``s``."""
        ...


class Progress:
    """The messages an op is blocked on right now (read when its deadline passes)."""

    __slots__ = ("held", "offering", "recvs", "sends")

    def __init__(self) -> None:
        self.recvs: list[tuple[int, asyncio.Future[None]]] = []
        self.sends: set[int] = set()
        self.offering = False  # some send went as an offer (``executor.send_offered``)
        self.held: list[tuple[asyncio.Future[Any], Callable[[], None]]] | None = None  # made when first needed

    def hold(self, read: asyncio.Future[Any], over: Callable[[], None]) -> None:
        """An offer a peer was reading when this op gave up: ``read`` ends with the read."""
        if self.held is None:
            self.held = []
        self.held.append((read, over))

    async def let_go(self, within: float = 1.0) -> None:
        """Before a failed op hands its buffers back: wait (at most ``within`` s each) for the reads of
        its offers that were under way, so no peer reads a buffer the caller is writing again."""
        await asyncio.sleep(0)  # the op's cancelled sends run their ends first
        while self.held:  # None or empty: nothing to wait for
            read, over = self.held.pop()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(read), within)
            over()

    def waiting_for(self) -> list[int]:
        return sorted({p for p, f in self.recvs if not f.done() or f.cancelled()} | self.sends)

    def blocked_on(self) -> list[int]:
        """Whom this op still needs: ``waiting_for`` plus receives a peer's notice failed (their data
        never came either), for following a timeout's chain (``blame.py``)."""
        return sorted({p for p, f in self.recvs if not f.done() or f.cancelled() or f.exception() is not None}
                      | self.sends)

    def told(self) -> BaseException | None:
        """The error a peer's notice already set on a receive, if any. The notice and this rank's own
        deadline may land in one loop turn; the notice is then the root cause, and the receives it
        failed no longer say whom this rank waited for."""
        for _p, f in self.recvs:
            if f.done() and not f.cancelled() and f.exception() is not None:
                return f.exception()
        return None


NO_MESSAGES = Progress()  # the progress of every op without messages: never written


class Op(Generic[A]):
    """One collective (a plain slotted class: one is built on every call). ``inp``/``out`` are flat
    typed numpy arrays on the host (``out`` may be ``inp``), the caller's buffers for GPU ops."""

    __slots__ = ("name", "code", "seq", "sched", "inp", "out", "dtype_code", "op", "count", "root", "timeout",
                 "work", "result", "order", "desc", "fp", "deadline", "progress", "gen", "waiting", "pending",
                 "scratch_raw", "chan", "_shift", "base", "native")

    def __init__(self, name: str, code: int, seq: int, inp: A, out: A, dtype_code: int, op: ReduceOp | None,
                 count: int, root: int, timeout: float, work: Work[Any] | None, result: Callable[[], Any],
                 sched: Schedule = NO_SCHEDULE, order: int = 0, desc: Any = None, native: Any = None) -> None:
        """The one way an op is made: with its ``Work`` (``Work(name, seq)`` when ``work`` is None), which asks
        the op whom it waits for (``Communicator.pending()``)."""
        if work is None:
            work = Work(name, seq)
        work._probe = self.blocked_on
        self.name, self.code, self.seq, self.sched = name, code, seq, sched
        self.inp, self.out, self.dtype_code, self.op = inp, out, dtype_code, op
        self.count, self.root, self.timeout, self.work, self.result = count, root, timeout, work, result
        self.order = order  # issue number among its channel's ops: a channel runs them in this order
        self.desc = desc  # (count, dtype, reduction, root): the flight recorder's entry, formatted when read
        self.fp: Fingerprint = (code, dtype_code, op.code if op is not None else 0, count, root)
        self.deadline = 0.0  # set when the op starts
        self.base = 0  # a channel's op: its step counter when the op started (the same on every rank)
        self.progress = Progress() if sched.messages else NO_MESSAGES
        self.gen: Generator[Any, None, None] | None = None  # the executor, while it runs
        self.waiting: Wait | None = None  # the shared-memory step it waits for
        self.pending: asyncio.Future[Any] | None = None  # the message it waits for (on a channel)
        self.scratch_raw: np.ndarray | None = None
        self.chan: Lockstep | None = None
        self._shift: int | None | bool = False  # OUT's element offset inside IN (False: not computed yet)
        self.native = native  # a channel's op: its schedule lowered for the native core (shm_native.py), or None

    @classmethod
    def from_template(cls, template: tuple[Any, ...], seq: int, order: int, inp: Any, out: Any, timeout: float,
                      given: Any) -> Op[Any]:
        """An op a native caller started from a form it learnt: ``template`` is ``(name, code, dtype_code, op,
        count, root, sched, desc)`` (what the lane keeps of the op it learnt from), its Work gives ``given``."""
        name, code, dtype_code, rop, count, root, sched, desc = template
        flat_in: Any = _EMPTY if inp is None else inp.reshape(-1)
        flat_out: Any = _EMPTY if out is None else out.reshape(-1)
        return cls(name, code, seq, flat_in, flat_out, dtype_code, rop, count, root, timeout, None, lambda: given,
                   sched, order, desc)

    def what(self, ctx: int) -> str:
        return f"{self.name} (seq {self.seq}, comm {ctx:x})"

    def blocked_on(self) -> list[int] | None:
        """The communicator ranks this op waits for now; None while it is queued behind others."""
        if self.gen is None:
            return None
        ranks = set(self.progress.waiting_for())
        if self.chan is not None and self.waiting is not None:
            ranks.update(self.chan.missing(*self.waiting))
        return sorted(ranks)

    # -- in place: where my own IN and OUT lie relative to each other ------------------------------
    def out_in_in(self) -> int | None:
        """OUT's element offset inside IN when they share memory (reduce_scatter in place), else None."""
        if self._shift is False:
            inp, out = self.inp, self.out
            self._shift = _shift(inp, out) if isinstance(inp, np.ndarray) and isinstance(out, np.ndarray) else None
        return self._shift

    def same_memory(self, reg: Region, dst: Region) -> bool:
        """Does my own ``reg`` lie exactly at ``dst`` (a copy to skip)?"""
        if reg.buf == dst.buf:
            return reg.start == dst.start
        return reg.buf == IN and dst.buf == OUT and self.out_in_in() == reg.start - dst.start

    def overlaps(self, reg: Region, dst: Region) -> bool:
        if reg.buf == dst.buf:
            return reg.start < dst.stop and dst.start < reg.stop
        sh = self.out_in_in() if reg.buf == IN and dst.buf == OUT else None
        return sh is not None and reg.start < dst.stop + sh and dst.start + sh < reg.stop


def _shift(inp: np.ndarray, out: np.ndarray) -> int | None:
    if not inp.size or not out.size:
        return None
    a: int = inp.__array_interface__["data"][0]
    b: int = out.__array_interface__["data"][0]
    if a <= b < a + inp.nbytes:
        return (b - a) // inp.itemsize
    return None
