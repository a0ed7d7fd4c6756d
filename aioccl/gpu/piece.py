"""A GPU piece lowered to the kernel's arguments, and the kernel's meaning in numpy: no GPU, no I/O.

``plans.ipc_pieces`` says what a piece does as a ``Step`` of the one schedule
vocabulary. ``lower`` turns that Step into the integers that
``kernels/gpu_piece.py``'s kernel takes (which blocks to publish, whether to
reduce over ranks ``0..nred-1`` or fetch block by block, from which slot);
it refuses a Step the kernel cannot express, so the plans and the kernel
cannot drift apart silently.

``emulate`` is the kernel, launch for launch, on raw addresses with numpy:
the flag protocol (publish, release the epoch, wait for every peer's epoch
with a deadline, compare fingerprints) and the data movement;
``emulate_small`` is the small all_reduce's kernel (``kernels/gpu_small.cu``:
LL lines, data and epoch together) the same way.
``tests/test_gpu_piece.py`` runs it in threads over shared memory to test
the protocol (ordering, counters that only count up, the deadline, the
error word), and the fakecupy stand-in runs it as its "GPU" so the whole
GPU path runs on machines without one.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..algorithms.schedule import Fetch, Reduce, Step
from ..dtypes import ReduceOp
from ..kernels import cpu
from ..kernels import gpu_piece as K
from . import plans


@dataclass(frozen=True, slots=True)
class Piece:
    """One launch's data arguments (elements, not bytes)."""

    a: int  # the piece is elements [a, a + n) of each block
    n: int
    pub_blocks: int  # input blocks this rank copies into its scratch (0: it has no input)
    out_blocks: int  # fetched output blocks (when nred == 0)
    nred: int  # reduce the same slot of ranks 0 .. nred-1, in rank order (0: fetch instead)
    src_root: int  # the rank fetched from when out_blocks == 1
    slot_block: int  # the slot read in each source's scratch is slot_block * n
    divisor: int  # avg: divide the reduction by this (0: do not)


def lower(step: Step, count: int, rank: int, op: ReduceOp | None, name: str, nranks: int) -> Piece:
    """The kernel arguments of ``step`` (one of ``plans.ipc_pieces``); ``count`` is the per-block count."""
    a = n = -1
    if step.stage:
        a, n = step.stage[0].src.start, step.stage[0].src.count  # block 0's part: [a, a + n)
        for j, st in enumerate(step.stage):
            if st.src.start != j * count + a or st.slot != j * n or st.src.count != n:
                raise ValueError(f"a GPU piece stages block {j} at an unexpected place: {st}")
    nred = out_blocks = src_root = slot_block = divisor = 0
    reads = step.reads
    if reads and isinstance(reads[0], Reduce):
        if len(reads) != 1:
            raise ValueError("a GPU piece reduces one region")
        red = reads[0]
        srcs = red.srcs
        a, n = red.dst.start, red.dst.count
        if [s.rank for s in srcs] != list(range(len(srcs))) or len({s.slot for s in srcs}) != 1:
            raise ValueError("a GPU piece reduces the same slot of ranks 0.. in order")
        nred, slot_block = len(srcs), srcs[0].slot // max(1, n)
        if op is ReduceOp.AVG:
            divisor = plans.divisor(name, rank, nranks)
    elif reads:
        fetches = [r for r in reads if isinstance(r, Fetch)]
        out_blocks, src_root = len(fetches), fetches[0].src.rank
        n = fetches[0].src.region.count
        a = fetches[0].dst.start
        slot_block = fetches[0].src.slot // max(1, n)
        for k, f in enumerate(fetches):
            if f.dst.start != k * count + a or f.src.slot != slot_block * n or (out_blocks > 1 and f.src.rank != k):
                raise ValueError(f"a GPU piece fetches block {k} from an unexpected place: {f}")
    if n < 0:
        raise ValueError("a GPU piece with neither input nor output")
    return Piece(a, n, len(step.stage), out_blocks, nred, src_root, slot_block, divisor)


def fingerprint(code: int, dtype: int, redop: int, count: int, root: int) -> int:
    """The op as one 64-bit word beside the flags: what every rank compares on the device."""
    return ((code & 0xFF) << 56) | ((dtype & 0xFF) << 48) | ((redop & 0xF) << 44) | ((root & 0xFF) << 36) \
        | (count & ((1 << 36) - 1))


def unpack_fingerprint(fp: int) -> tuple[int, int, int, int, int]:
    """(code, dtype, redop, count, root) as ``engine.notices.describe_call`` reads them (count mod 2**36)."""
    return (fp >> 56) & 0xFF, (fp >> 48) & 0xFF, (fp >> 44) & 0xF, fp & ((1 << 36) - 1), (fp >> 36) & 0xFF


def _mem(ptr: int, nbytes: int, dt: Any) -> np.ndarray:
    if nbytes <= 0:
        return np.empty(0, dt)
    return np.frombuffer(memoryview((ctypes.c_char * nbytes).from_address(ptr)).cast("B"), dtype=dt)


def emulate(dt: np.dtype, op: ReduceOp, grid: int, bases_ptr: int, in_ptr: int, out_ptr: int, err_ptr: int,
            count: int, a: int, n: int, half_bytes: int, timeout_ns: int, fp: int, divisor: float, rank: int,
            nranks: int, pub_blocks: int, out_blocks: int, nred: int, src_root: int, slot_block: int, phase: int,
            epoch_host: int, kind: int, *, sleep: Callable[[float], None] = time.sleep) -> None:
    """The kernel's effect, the whole grid at once, from its exact arguments (after ``dt``, ``op`` and the
    grid size, which a launch carries in the kernel's name and its configuration)."""
    isz = dt.itemsize
    bases = [int(b) for b in _mem(bases_ptr, 8 * nranks, np.uint64)]
    flags = [_mem(b, 4 * grid, np.uint32) for b in bases]
    fps = [_mem(b + K.FP_OFFSET, 16, np.uint64) for b in bases]
    err = _mem(err_ptr, 16, np.uint32)
    e = epoch_host or (int(flags[rank][0]) + 1) & 0xFFFFFFFF
    half = K.HEADER_BYTES + (e & 1) * half_bytes

    def scratch(r: int, elems: int) -> np.ndarray:
        return _mem(bases[r] + half, elems * isz, dt)

    def fail(code: int, peer: int) -> None:
        if err[0] == 0:
            err[1:4] = (peer, e, kind)
            err[0] = code

    if phase & K.PUBLISH:
        mine = scratch(rank, pub_blocks * n)
        src = _mem(in_ptr, (max(0, pub_blocks - 1) * count + a + n) * isz, dt)
        for j in range(pub_blocks):
            mine[j * n:(j + 1) * n] = src[j * count + a:j * count + a + n]
        fps[rank][e & 1] = fp
    if phase & K.SYNC:
        flags[rank][:] = e
        t0 = time.monotonic_ns()
        for peer in range(nranks):
            while any(((int(v) - e) & 0xFFFFFFFF) >= 0x80000000 for v in flags[peer]):
                if err[0]:
                    return
                if time.monotonic_ns() - t0 > timeout_ns:
                    fail(K.ERR_TIMEOUT, peer)
                    return
                sleep(0.0001)
    if not phase & K.CONSUME:
        return
    for peer in range(nranks):
        if int(fps[peer][e & 1]) != fp:
            fail(K.ERR_MISMATCH, peer)
            return
    if nred:
        out = _mem(out_ptr, (a + n) * isz, dt)[a:a + n]
        out[:] = scratch(0, (slot_block + 1) * n)[slot_block * n:]
        for r in range(1, nred):
            cpu.combine(op, out, out, scratch(r, (slot_block + 1) * n)[slot_block * n:])
        if divisor:
            cpu.scale(ReduceOp.AVG, out, int(divisor))
    elif out_blocks:
        out = _mem(out_ptr, ((out_blocks - 1) * count + a + n) * isz, dt)
        for k in range(out_blocks):
            src_rank = k if out_blocks > 1 else src_root
            out[k * count + a:k * count + a + n] = scratch(src_rank, (slot_block + 1) * n)[slot_block * n:]


def emulate_small(dt: np.dtype, op: ReduceOp, grid: int, bases_ptr: int, in_ptr: int, out_ptr: int, err_ptr: int,
                  count: int, a: int, n: int, half_bytes: int, timeout_ns: int, fp: int, divisor: float, rank: int,
                  nranks: int, pub_blocks: int, out_blocks: int, nred: int, src_root: int, slot_block: int,
                  phase: int, epoch_host: int, kind: int, *, sleep: Callable[[float], None] = time.sleep) -> None:
    """``gpu_small.cu``'s effect from the piece kernel's arguments: this rank's input as lines (line 0 the
    fingerprint; data before epochs, as one 16-byte store orders them for a reader), the epoch in every flag
    word, then every rank's lines in rank order, reduced, written only when all arrived and agreed."""
    isz = dt.itemsize
    lines = 1 + -(-n // (8 // isz))
    bases = [int(b) for b in _mem(bases_ptr, 8 * nranks, np.uint64)]
    flags = _mem(bases[rank], 4 * K.FLAG_WORDS, np.uint32)
    err = _mem(err_ptr, 16, np.uint32)
    e = epoch_host or (int(flags[0]) + 1) & 0xFFFFFFFF
    half = K.LL_OFFSET + (e & 1) * K.LL_HALF_BYTES

    def ll(r: int) -> np.ndarray:
        return _mem(bases[r] + half, lines * 16, np.uint32).reshape(lines, 4)

    def fail(code: int, peer: int) -> None:
        if err[0] == 0:
            err[1:4] = (peer, e, kind)
            err[0] = code

    words = np.zeros(lines * 2, np.uint32)
    words[:2] = np.array([fp], np.uint64).view(np.uint32)
    words[2:].view(np.uint8)[:n * isz] = _mem(in_ptr, (a + n) * isz, np.uint8)[a * isz:]
    mine = ll(rank)
    mine[:, 0], mine[:, 2] = words[0::2], words[1::2]
    mine[:, 1] = mine[:, 3] = e
    _mem(bases[rank] + K.FP_OFFSET, 16, np.uint64)[e & 1] = fp
    flags[:] = e
    got = []
    t0 = time.monotonic_ns()
    for r in range(nranks):
        theirs = ll(r)
        for part in (theirs[:1], theirs):  # the fingerprint line first: a peer of another op has fewer lines
            while not ((part[:, 1] == e).all() and (part[:, 3] == e).all()):
                peer_flag = int(_mem(bases[r], 4, np.uint32)[0])
                if part.shape[0] == 1 and ((peer_flag - e) & 0xFFFFFFFF) < 0x80000000 \
                        and int(_mem(bases[r] + K.FP_OFFSET, 16, np.uint64)[e & 1]) != fp:
                    fail(K.ERR_MISMATCH, r)  # a piece kernel at this epoch: no lines will come
                    return
                if err[0]:
                    return
                if time.monotonic_ns() - t0 > timeout_ns:
                    fail(K.ERR_TIMEOUT, r)
                    return
                sleep(0.0001)
            if int(np.array([theirs[0, 0], theirs[0, 2]], np.uint32).view(np.uint64)[0]) != fp:
                fail(K.ERR_MISMATCH, r)
                return
        data = np.empty(lines * 2, np.uint32)
        data[0::2], data[1::2] = theirs[:, 0], theirs[:, 2]
        got.append(data[2:].view(np.uint8)[:n * isz].view(dt))
    out = _mem(out_ptr, (a + n) * isz, dt)[a:a + n]
    acc = got[0].copy()
    for v in got[1:]:
        cpu.combine(op, acc, acc, v)
    if divisor:
        cpu.scale(ReduceOp.AVG, acc, int(divisor))
    out[:] = acc
