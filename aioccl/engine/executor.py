"""The one executor: runs one rank's schedule, message steps and shared-memory steps alike.

It follows the step contract of ``aioccl.algorithms.schedule`` exactly and
is a generator that *yields what it waits for*, never blocking itself:

- an awaitable (a send going out, a posted receive's future) for messages,
  over whatever transport the pair uses (tcp, rdma, a shared-memory pair);
- a ``Wait`` ``(ranks, step)`` when a lockstep step needs those ranks of the
  communicator's shared-memory channel to have published ``step``.

So it has no notion of time or of the event loop, and two drivers run it:
``Engine.run_collective`` awaits what it yields (a communicator without a
channel), and ``ShmChannel`` spins on counters, parks until a doorbell or a
future, and owns the deadline (a communicator whose ranks share a host).

Messages between a pair are numbered per op, in schedule order, and every
frame carries the op's fingerprint, so a peer that issued another call
notices at once. The first lockstep step of an op writes this rank's
*descriptor* (the fingerprint, the algorithm, and where its registered
buffers lie) and waits for every rank, so all ranks read all descriptors at
the same step: an op issued differently somewhere fails everywhere with
``CollectiveMismatch`` after exactly one step, and the channel stays in step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Generator
from typing import TYPE_CHECKING, Any

import numpy as np

from ..algorithms.schedule import IN, OUT, SCRATCH, Fetch, Recv, RecvReduce, Region, Src
from ..algorithms.table import BY_CODE, name_of
from ..buffers import byte_view
from ..dtypes import ReduceOp, dtype_from_code
from ..errors import AiocclError, CollectiveMismatch
from ..kernels import UFUNCS, combine, scale
from ..transport.frames import COFFER, COLL, unpack
from ..transport.frames import pack as pack_header
from .op import Op, Progress, Wait
from .p2p.offers import Offer
from .p2p.rendezvous import OFFER_MIN, OFFER_TAIL, SEND_DATA, data

if TYPE_CHECKING:
    from .services import EngineServices
    from .shm.channel import ShmChannel
    from .view import CommView

Yield = Wait | Awaitable[Any]
ALGO_CODES = {"flat": 1, "direct": 2}
# descriptor fields: registered offsets (D_IN, D_OUT) and in-place addresses (D_IN_AT, D_OUT_AT; the native
# core offers them, this executor only reads them) say where peers read a buffer that is not staged
D_SEQ, D_KIND, D_COUNT, D_ROOT, D_IN, D_OUT, D_IN_AT, D_OUT_AT = range(8)


def execute(eng: EngineServices, view: CommView, op: Op[np.ndarray], scratch: np.ndarray,
            ch: ShmChannel | None = None) -> Generator[Yield, None, None]:
    """``ch``: the communicator's channel, which runs ``op`` (needed by lockstep steps only)."""
    sched = op.sched
    bufs = (op.inp, op.out, scratch)
    messages = sched.messages
    item = op.out.itemsize
    mailbox = eng.mailbox
    descs: list[tuple[int, ...]] = []
    first, zero_copy, half = True, False, 0
    in_off = out_off = -1
    me, dtype = view.rank, op.out.dtype
    mine: tuple[int, ...] = ()  # my descriptor, for an op with lockstep steps
    if ch is not None and sched.lockstep:
        if sched.zero_copy:
            in_off, out_off = ch.heap_offset(op.inp), ch.heap_offset(op.out)
        kind = op.code | ALGO_CODES.get(sched.algo, 0) << 8 | op.dtype_code << 16 | op.fp[2] << 24
        mine = (op.seq, kind, op.count, op.root, in_off, out_off, -1, -1)
    if messages:  # the per-op state of message steps: byte views, per-peer message numbers
        msg = _MessageState(eng, view, op, bufs)
    try:
        if messages:
            doomed = mailbox.begin(view.ctx, op.seq, op.fp, view.ranks, view.rank)
            if doomed is not None:
                raise doomed
        for index, step in enumerate(sched.steps):
            if step.copies:
                yield from _copy(bufs, step.copies)
            if step.lockstep:
                assert ch is not None, "a lockstep step needs the communicator's shared-memory channel"
                s = ch.step + 1
                if (step.stage or first) and ch.all_reached < s - 1:
                    yield ch.others, s - 1  # my slot half is free once everyone has moved past step s - 2
                half = s & 1
                if first:
                    ch.write_descriptor(half, mine)
                if step.stage:  # inline, like the reads below: this is the 8-byte op's hot path
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
            if messages and (step.recvs or step.sends):
                yield from msg.run(step, sched.early[index])
            if step.lockstep:
                assert ch is not None
                wait = ch.others if first else step.wait
                if wait:
                    yield wait, s
                if first:
                    first = False
                    descs = ch.read_descriptors(half, mine)
                    for j in ch.others:  # everyone issued what I did? (and does anyone expose a buffer?)
                        d = descs[j]
                        if d[:D_IN] != mine[:D_IN]:
                            raise _mismatch(ch, op, j, d, mine)
                        zero_copy = zero_copy or d[D_IN] >= 0 or d[D_OUT] >= 0 or d[D_IN_AT] >= 0 or d[D_OUT_AT] >= 0
                    zero_copy = zero_copy or in_off >= 0 or out_off >= 0
            if messages:
                for t in step.recvs[sched.early[index]:]:  # the leading ones were reduced as they landed
                    if isinstance(t, RecvReduce) and op.op is not None:
                        yield from combined(op.op, _typed(bufs, t.dst), _typed(bufs, t.src), _typed(bufs, t.tmp))
            for rd in step.reads:
                assert ch is not None
                dst_r = rd.dst
                if dst_r.stop == dst_r.start:
                    continue
                if isinstance(rd, Fetch):
                    fs = rd.src
                    if fs.rank != me:
                        bufs[dst_r.buf][dst_r.start:dst_r.stop] = _peer(ch, descs, fs, half, item, dtype)
                    elif not op.same_memory(fs.region, dst_r):
                        bufs[dst_r.buf][dst_r.start:dst_r.stop] = bufs[fs.region.buf][fs.region.start:fs.region.stop]
                    continue
                dst = bufs[dst_r.buf][dst_r.start:dst_r.stop]
                ufunc = UFUNCS[op.op]  # type: ignore[index]  # only reducing ops have Reduce reads
                arrs = [bufs[x.region.buf][x.region.start:x.region.stop] if x.rank == me
                        else _peer(ch, descs, x, half, item, dtype) for x in rd.srcs]
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
            if op.op is ReduceOp.AVG:
                for reg in step.scale:
                    scale(op.op, _typed(bufs, reg), sched.divisor or view.size)
        if zero_copy:  # peers may still read my registered buffer; nobody returns one before all are done
            assert ch is not None
            s = ch.step + 1
            ch.publish(s)
            yield ch.others, s
        if messages:
            doomed = mailbox.end(view.ctx, op.seq)
            if doomed is not None:
                raise doomed
    except BaseException:
        if messages:  # drop its posted receives, and discard its late frames
            mailbox.forget_op(view.ctx, op.seq)
        raise


async def drive(gen: Generator[Yield, None, None]) -> None:
    """Run an executor that waits only for messages (a communicator without a channel)."""
    try:
        for waited in gen:
            assert not isinstance(waited, tuple), "a lockstep step on a communicator without a channel"
            await waited
    finally:
        gen.close()  # a failed op's executor drops the receives it posted


PIECE_BYTES = 256 << 10  # a large message's reduction goes in pieces this big ...
HOLD_S = 200e-6  # ... handing the loop back whenever it has held it this long (other tasks, timers)


def combined(reduce_op: ReduceOp, dst: np.ndarray, a: np.ndarray, b: np.ndarray) -> Generator[Yield, None, None]:
    """``dst = op(a, b)``, in pieces for a large message, with the loop handed back between them once the
    reduction has held it ``HOLD_S``: a 4 MiB chunk's reduction alone held an inline engine's loop ~1 ms."""
    piece = PIECE_BYTES // max(dst.itemsize, 1)
    if dst.size <= piece:
        combine(reduce_op, dst, a, b)
        return
    clock = time.perf_counter
    until = clock() + HOLD_S
    for i in range(0, dst.size, piece):
        j = i + piece
        combine(reduce_op, dst[i:j], a[i:j], b[i:j])
        if j < dst.size and clock() > until:
            yield asyncio.sleep(0)
            until = clock() + HOLD_S


def _copy(bufs: tuple[np.ndarray, ...], copies: tuple[Any, ...]) -> Generator[Yield, None, None]:
    """A step's local copies; a large one in pieces, handing the loop back as ``combined`` does."""
    clock = time.perf_counter
    until = clock() + HOLD_S
    for c in copies:
        src, dst = _typed(bufs, c.src), _typed(bufs, c.dst)
        if not src.size or src.__array_interface__["data"][0] == dst.__array_interface__["data"][0]:
            continue
        piece = PIECE_BYTES // max(dst.itemsize, 1) * 4
        if dst.size <= piece or np.may_share_memory(src, dst):  # overlapping: numpy's one copy handles it
            dst[...] = src
            continue
        for i in range(0, dst.size, piece):
            dst[i:i + piece] = src[i:i + piece]
            if i + piece < dst.size and clock() > until:
                yield asyncio.sleep(0)
                until = clock() + HOLD_S


def _typed(bufs: tuple[np.ndarray, ...], r: Region) -> np.ndarray:
    return bufs[r.buf][r.start:r.stop]


class _MessageState:
    """What an op's message steps share: its buffers as bytes, and the number of the next message
    to or from each peer (messages between a pair are numbered per op, in schedule order)."""

    __slots__ = ("eng", "view", "op", "bufs", "bytes", "item", "what", "sent_k", "recv_k")

    def __init__(self, eng: EngineServices, view: CommView, op: Op[np.ndarray], bufs: tuple[np.ndarray, ...]) -> None:
        self.eng, self.view, self.op, self.bufs = eng, view, op, bufs
        self.bytes = tuple(byte_view(b) for b in bufs)
        self.item = op.out.itemsize
        self.what = op.what(view.ctx)
        self.sent_k: dict[int, int] = {}
        self.recv_k: dict[int, int] = {}

    def raw(self, r: Region) -> memoryview:
        return self.bytes[r.buf][r.start * self.item:r.stop * self.item]

    def run(self, step: Any, early: int) -> Generator[Yield, None, None]:
        """Post the step's receives, send its sends, and wait for all of them, reducing the ``early``
        leading ones as each lands."""
        eng, op, ranks, ctx = self.eng, self.op, self.view.ranks, self.view.ctx
        progress, sent_k, recv_k = op.progress, self.sent_k, self.recv_k
        progress.recvs.clear()
        for t in step.recvs:
            k = recv_k.get(t.peer, 0)
            recv_k[t.peer] = k + 1
            target = self.raw(t.dst if isinstance(t, Recv) else t.tmp)
            fut = eng.mailbox.post(ranks[t.peer], ctx, op.seq, k, target, op.code, op.dtype_code, self.what)
            progress.recvs.append((t.peer, fut))
        if step.sends:
            code, dtype_code, redop, count, root = op.fp
            sends = []
            for snd in step.sends:
                k = sent_k.get(snd.peer, 0)
                sent_k[snd.peer] = k + 1
                payload = self.raw(snd.src)
                hdr = pack_header(COLL, code, dtype_code, k, ctx, op.seq, len(payload), count, root, redop)
                sends.append(_send(eng, self.view, snd.peer, hdr, payload, progress))
            yield sends[0] if len(sends) == 1 else asyncio.gather(*sends)
        reduce_op = op.op
        for i, (_peer, fut) in enumerate(progress.recvs):
            if not fut.done():
                yield fut
            # a receive that failed while this step awaited its sends (a peer's mismatched frame, a notice)
            # raises here, before anything reads its buffer: data is combined only once its frame passed
            # the fingerprint check, so no result carries another call's data
            fut.result()
            if i < early and reduce_op is not None:  # reduce what has landed while the rest still arrives
                t = step.recvs[i]
                yield from combined(reduce_op, _typed(self.bufs, t.dst), _typed(self.bufs, t.src),
                                    _typed(self.bufs, t.tmp))


async def _send(eng: EngineServices, view: CommView, peer: int, hdr: bytes, payload: memoryview,
                progress: Progress) -> None:
    progress.sends.add(peer)
    world = view.ranks[peer]
    if len(payload) >= OFFER_MIN and getattr(eng.conns.get(world), "memory", None) is not None:
        await send_offered(eng, world, hdr, payload, progress)  # read in place by the same-host peer
    else:
        await eng.send(world, hdr, payload)
    progress.sends.discard(peer)


# -- shared memory ------------------------------------------------------------------------------------
def _mismatch(ch: ShmChannel, op: Op[np.ndarray], j: int, theirs_d: tuple[int, ...], mine: tuple[int, ...]
              ) -> CollectiveMismatch:
    """Rank ``j``'s descriptor says it issued another call than mine."""
    theirs, ours = describe(theirs_d), describe(mine)
    return CollectiveMismatch(f"collective mismatch at seq {op.seq} over shared memory: rank {j} issued {theirs}, "
                              f"rank {ch.rank} issued {ours}", op.seq, (j, ch.rank), (theirs, ours))


def _peer(ch: ShmChannel, descs: list[tuple[int, ...]], src: Src, half: int, item: int,
          dtype: np.dtype[Any]) -> np.ndarray:
    """Rank ``src.rank``'s staged (or registered) region, as an array over its segment; or a copy of it,
    read in place from the peer's process where its descriptor offers that buffer."""
    reg = src.region
    at = descs[src.rank][D_IN_AT if reg.buf == IN else D_OUT_AT] if reg.buf != SCRATCH else -1
    if at >= 0:
        return _read_in_place(ch, src.rank, at + reg.start * item, reg.stop - reg.start, dtype)
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


def _read_in_place(ch: ShmChannel, j: int, addr: int, count: int, dtype: np.dtype[Any]) -> np.ndarray:
    readers = ch.readers
    mem = readers[j] if readers is not None else None
    if mem is None:
        raise AiocclError(f"rank {j} lets its buffer be read in place, but this channel does not read in place: "
                          "a corrupted or foreign peer")
    arr = np.empty(count, dtype)
    if count and not mem.read(int(arr.ctypes.data), addr, arr.nbytes):
        raise AiocclError(f"reading {arr.nbytes} bytes of rank {j}'s buffer in place (process {mem.pid}) failed")
    ch.stats["cma_reads"] += 1
    return arr


def describe(desc: tuple[int, ...]) -> str:
    """A shared-memory descriptor, as a mismatch error says it."""
    kind = desc[D_KIND]
    code, algo, dtype, op = kind & 0xFF, (kind >> 8) & 0xFF, (kind >> 16) & 0xFF, (kind >> 24) & 0xFF
    dt = dtype_from_code(dtype)
    algo_name = next((a for a, c in ALGO_CODES.items() if c == algo), "?")
    row = BY_CODE.get(code)  # only what the call takes: an all_reduce has no root, a broadcast no op
    op_name = next((o.value for o in ReduceOp if o.code == op), None) if row is None or row.reduces else None
    root = f", root {desc[D_ROOT]}" if row is None or row.rooted else ""
    return (f"{name_of(code)} seq {desc[D_SEQ]} of {desc[D_COUNT]} x {dt.name if dt is not None else '-'}"
            f"{', op ' + op_name if op_name else ''}{root}, algorithm {algo_name}")


async def send_offered(eng: EngineServices, world: int, hdr: bytes, payload: memoryview, progress: Progress) -> None:
    """A collective's message to a same-host peer that may read this process's memory: the header with an
    offer instead of the data; the peer reads it in place (RDONE) or clears it to send (CTS, then RDATA).
    An offer a peer was reading when the op gave up is handed to ``progress``, which waits for the read to
    end before the op lets its buffers go."""
    offer = Offer.make(payload)
    if offer is None:  # every offer slot in use
        await eng.send(world, hdr, payload)
        return
    rdv = eng.mailbox.rdv
    rid, cts = rdv.expect_cts(world)
    h = unpack(hdr)
    extra = offer.packed + OFFER_TAIL.pack(rid, len(payload))
    progress.offering = True
    done = False
    try:
        await eng.send(world, h._replace(kind=COFFER, nbytes=len(extra)).pack(), memoryview(extra))
        if await asyncio.shield(cts) == SEND_DATA:
            await eng.send(world, data(h.ctx, h.seq, h.dtype, len(payload), rid), payload)
        done = True
    finally:
        def over() -> None:
            rdv.forget(world, rid)
            offer.release()

        if done or offer.withdraw():
            over()
        else:
            progress.hold(cts, over)
