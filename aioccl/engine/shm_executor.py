"""Run one rank's shared-memory schedule as a generator of waits.

``execute()`` does the stage / publish / read work of each
``Step`` and *yields* ``(ranks, step)`` whenever
it needs those ranks to have published ``step``. It never blocks: the
``ShmChannel`` decides whether to spin, or park the op
until a doorbell rings, and resumes it. That keeps the data path free of
any notion of time or of the event loop.

The first step of every op writes this rank's *descriptor* (op, dtype,
count, root, algorithm, sequence number, and where its registered buffers
lie) and waits for every rank, so all ranks read all descriptors at the same
step: an op issued differently somewhere fails everywhere with
``CollectiveMismatch`` after exactly one step, and the channel
stays in step for the next op.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from ..algorithms.schedule import IN, OUT, SCRATCH, Region
from ..algorithms.shm import Fetch, ShmSchedule, Src
from ..algorithms.table import name_of
from ..dtypes import ReduceOp, dtype_from_code
from ..errors import CollectiveMismatch
from ..kernels import UFUNCS, scale
from ..work import Work

if TYPE_CHECKING:
    from .shm_channel import ShmChannel

Wait = tuple[tuple[int, ...], int]
ALGO_CODES = {"flat": 1, "direct": 2}
# descriptor fields
D_SEQ, D_KIND, D_COUNT, D_ROOT, D_IN, D_OUT = range(6)


class ShmOp:
    """One collective handed to the channel (a plain slotted class: it is built on every call)."""

    __slots__ = ("name", "code", "seq", "sched", "inp", "out", "dtype_code", "op", "count", "root", "timeout",
                 "work", "result", "kind", "deadline", "gen", "waiting", "scratch_raw", "_shift", "chan", "order")

    def __init__(self, name: str, code: int, seq: int, sched: ShmSchedule, inp: np.ndarray, out: np.ndarray,
                 dtype_code: int, op: ReduceOp | None, count: int, root: int, timeout: float, work: Work[Any],
                 result: Callable[[], Any], order: int = 0) -> None:
        self.name, self.code, self.seq, self.sched = name, code, seq, sched
        self.order = order  # issue number among this channel's ops: they run in this order
        self.inp, self.out, self.dtype_code, self.op = inp, out, dtype_code, op  # flat, typed; out may be inp
        self.count, self.root, self.timeout, self.work, self.result = count, root, timeout, work, result
        self.kind = _kind(code, sched.algo, dtype_code, op)
        self.deadline = 0.0  # set when the op starts (perf_counter seconds)
        self.gen: Generator[Wait, None, None] | None = None
        self.waiting: Wait | None = None
        self.scratch_raw: np.ndarray | None = None
        self._shift: int | None | bool = False  # OUT's element offset inside IN (False: not computed yet)
        self.chan: ShmChannel | None = None

    def blocked_on(self) -> list[int] | None:
        """The ranks that have not published the step this op waits for; None while queued."""
        chan, waiting = self.chan, self.waiting
        if chan is None or self.gen is None:
            return None
        return chan.missing(*waiting) if waiting is not None else []

    def out_in_in(self) -> int | None:
        """OUT's element offset inside IN when they share memory (reduce_scatter in place), else None."""
        if self._shift is False:
            self._shift = _shift(self.inp, self.out)
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


@lru_cache(maxsize=1024)
def _kind(code: int, algo: str, dtype_code: int, op: ReduceOp | None) -> int:
    op_code = op.code if op is not None else 0
    return code | ALGO_CODES.get(algo, 0) << 8 | dtype_code << 16 | op_code << 24


def describe(desc: tuple[int, ...]) -> str:
    kind = desc[D_KIND]
    code, algo, dtype, op = kind & 0xFF, (kind >> 8) & 0xFF, (kind >> 16) & 0xFF, (kind >> 24) & 0xFF
    name = name_of(code)
    dt = dtype_from_code(dtype)
    algo_name = next((a for a, c in ALGO_CODES.items() if c == algo), "?")
    op_name = next((o.value for o in ReduceOp if o.code == op), None)
    return (f"{name} seq {desc[D_SEQ]} of {desc[D_COUNT]} x {dt.name if dt is not None else '-'}"
            f"{', op ' + op_name if op_name else ''}, root {desc[D_ROOT]}, algorithm {algo_name}")


def execute(ch: ShmChannel, op: ShmOp, scratch: np.ndarray) -> Generator[Wait, None, None]:
    sched, me, n = op.sched, ch.rank, ch.size
    others = ch.others
    item = op.out.itemsize
    dtype = op.out.dtype
    bufs = (op.inp, op.out, scratch)
    in_off = ch.heap_offset(op.inp) if sched.zero_copy else -1
    out_off = ch.heap_offset(op.out) if sched.zero_copy else -1
    mine = (op.seq, op.kind, op.count, op.root, in_off, out_off)
    descs: list[tuple[int, ...]] = []
    reduce_op = op.op
    any_zero_copy = False
    first = True
    for step in sched.steps:
        s = ch.step + 1
        if (step.stage or first) and ch.all_reached < s - 1:
            yield others, s - 1  # my slot half is free once everyone has moved past step s - 2
        half = s & 1
        if first:
            ch.write_descriptor(half, mine)
        if step.stage:
            slot = ch.typed(me, dtype)
            base = ch.slot_base[me][half] // item
            for st in step.stage:
                reg = st.src
                if (reg.buf == IN and in_off >= 0) or (reg.buf == OUT and out_off >= 0):
                    continue  # registered: peers read it in place
                if reg.stop > reg.start:
                    start = base + st.slot
                    slot[start:start + reg.stop - reg.start] = bufs[reg.buf][reg.start:reg.stop]
        ch.publish(s)
        wait = others if first else step.wait
        if wait:
            yield wait, s
        if first:
            first = False
            descs = ch.read_descriptors(half, mine)
            for j in others:
                d = descs[j]
                if d[:D_IN] != mine[:D_IN]:
                    theirs, ours = describe(d), describe(mine)
                    raise CollectiveMismatch(f"collective mismatch at seq {op.seq} over shared memory: rank {j} "
                                             f"issued {theirs}, rank {me} issued {ours}", op.seq, (j, me),
                                             (theirs, ours))
                any_zero_copy = any_zero_copy or d[D_IN] >= 0 or d[D_OUT] >= 0
            any_zero_copy = any_zero_copy or in_off >= 0 or out_off >= 0
        for rd in step.reads:
            if isinstance(rd, Fetch):
                dst_r, src = rd.dst, rd.src
                if dst_r.stop == dst_r.start:
                    continue
                if src.rank == me:
                    if not op.same_memory(src.region, dst_r):
                        bufs[dst_r.buf][dst_r.start:dst_r.stop] = bufs[src.region.buf][src.region.start:src.region.stop]
                else:
                    bufs[dst_r.buf][dst_r.start:dst_r.stop] = _peer(ch, descs, src, half, item, dtype)
                continue
            dst_r = rd.dst
            if dst_r.stop == dst_r.start:
                continue
            dst = bufs[dst_r.buf][dst_r.start:dst_r.stop]
            assert reduce_op is not None
            ufunc = UFUNCS[reduce_op]
            arrs = [bufs[src.region.buf][src.region.start:src.region.stop] if src.rank == me
                    else _peer(ch, descs, src, half, item, dtype) for src in rd.srcs]
            # my own input may be the destination (in place); if it is read after the first
            # combine has overwritten it, reduce into scratch space first
            spill = me >= 2 and op.overlaps(rd.srcs[me].region, dst_r)
            acc = ch.spill(dst.nbytes).view(dtype)[:dst.size] if spill else dst
            if len(arrs) == 1:
                acc[...] = arrs[0]
            else:
                ufunc(arrs[0], arrs[1], out=acc)
                for k in range(2, len(arrs)):
                    ufunc(acc, arrs[k], out=acc)
            if spill:
                dst[...] = acc
        if reduce_op is ReduceOp.AVG:
            for reg in step.scale:
                scale(reduce_op, bufs[reg.buf][reg.start:reg.stop], n)
    if any_zero_copy:
        # peers may still be reading a registered buffer; nobody returns it to its owner before all are done
        s = ch.step + 1
        ch.publish(s)
        yield others, s


def _peer(ch: ShmChannel, descs: list[tuple[int, ...]], src: Src, half: int, item: int,
          dtype: np.dtype[Any]) -> np.ndarray:
    """Rank ``src.rank``'s staged (or registered) region, as an array over its segment."""
    reg = src.region
    off = descs[src.rank][D_IN if reg.buf == IN else D_OUT] if reg.buf != SCRATCH else -1
    count = reg.stop - reg.start
    if off >= 0:
        byte = off + reg.start * item
        if byte % item:  # a registered view at an odd byte offset
            return ch.u8[src.rank][byte:byte + count * item].view(dtype)
        start = byte // item
    else:
        start = ch.slot_base[src.rank][half] // item + src.slot
    return ch.typed(src.rank, dtype)[start:start + count]


def _shift(inp: np.ndarray, out: np.ndarray) -> int | None:
    if not inp.size or not out.size:
        return None
    a: int = inp.__array_interface__["data"][0]
    b: int = out.__array_interface__["data"][0]
    if a <= b < a + inp.nbytes:
        return (b - a) // inp.itemsize
    return None
