"""The device path's kernel without a GPU: its CUDA source compiles (NVRTC, sm_90), the plans lower to its
arguments, and its meaning (``aioccl.gpu.piece.emulate``) is run by threads over shared memory to test the
flag protocol: ordering, counters that only count up, the deadline, the fingerprint check."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from nvrtc_compile import LIB, compile_cubin

from aioccl.dtypes import ReduceOp, dtype_code
from aioccl.gpu import plans
from aioccl.gpu.piece import Piece, emulate, emulate_small, fingerprint, lower, unpack_fingerprint
from aioccl.kernels import gpu_piece as K

OPS = ("all_reduce", "reduce", "broadcast", "all_gather", "gather", "reduce_scatter", "scatter", "all_to_all", "scan")
ALL = K.PUBLISH | K.SYNC | K.CONSUME


@pytest.mark.skipif(LIB is None, reason="the nvidia-cuda-nvrtc wheel (make test installs it) is missing")
def test_every_kernel_variant_compiles_for_sm_90():
    cubin, log = compile_cubin(K.all_source(), "sm_90")
    assert cubin[:4] == b"\x7fELF", log
    for dt in K.DTYPES:
        for op in K.COMBINES:
            assert K.kernel_name(op, dt).encode() in cubin
            assert K.small_kernel_name(op, dt).encode() in cubin


class Ranks:
    """``n`` ranks' scratch (header + two halves), inputs, outputs and error words in this process."""

    def __init__(self, n: int, half_bytes: int) -> None:
        self.n, self.half = n, half_bytes
        self.scratch = [np.zeros(K.HEADER_BYTES + 2 * half_bytes, np.uint8) for _ in range(n)]
        self.bases = np.array([s.ctypes.data for s in self.scratch], np.uint64)
        self.err = [np.zeros(4, np.uint32) for _ in range(n)]

    def flags(self, r: int, grid: int) -> np.ndarray:
        return self.scratch[r][:4 * grid].view(np.uint32)

    def launch(self, r: int, dt: np.dtype, op: ReduceOp, inp: np.ndarray, out: np.ndarray, count: int, p: Piece,
               fp: int, phase: int, epoch: int = 0, grid: int = 4, timeout_s: float = 10.0,
               small: bool = False) -> None:
        run = emulate_small if small else emulate
        run(dt, op, grid, self.bases.ctypes.data, inp.ctypes.data, out.ctypes.data, self.err[r].ctypes.data,
            count, p.a, p.n, self.half, int(timeout_s * 1e9), fp, float(p.divisor), r, self.n, p.pub_blocks,
            p.out_blocks, p.nred, p.src_root, p.slot_block, phase, epoch, 1)


def _case(name: str, r: int, n: int, count: int, dt: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    blocked = name in plans.BLOCKED
    inp = (np.arange(count * (n if blocked else 1)) % 7 + 3 * r + 1).astype(dt)
    out = np.full(count * (n if name in ("all_gather", "gather", "all_to_all") else 1), -99, dt)
    return inp, out


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("name", OPS)
def test_the_plans_lower_to_kernel_arguments_that_do_what_the_plans_do(name, n):
    """Publish on every rank, then consume on every rank (the stream form's two launches, epoch from the
    host); the outputs equal ``plans.publish`` / ``plans.consume`` run with numpy, element for element."""
    dt, count, cap, root = np.dtype(np.int32), 11, 5 * n, n - 1
    op = ReduceOp.SUM
    ranks = Ranks(n, cap * dt.itemsize)
    bufs = [_case(name, r, n, count, dt) for r in range(n)]
    want = [b[1].copy() for b in bufs]
    scratches = [np.zeros(cap, dt) for _ in range(n)]
    steps = [plans.ipc_pieces(name, r, n, root, count, cap) for r in range(n)]
    fp = fingerprint(1, dtype_code(dt), op.code, count, root)
    for k in range(len(steps[0])):
        for r in range(n):
            plans.publish(steps[r][k], bufs[r][0], scratches[r], lambda d, s: d.__setitem__(slice(None), s))
        for r in range(n):
            plans.consume(steps[r][k], want[r], scratches, lambda d, s: d.__setitem__(slice(None), s),
                          lambda d, a, b: np.add(a, b, out=d), lambda d: None)
        pieces = [lower(steps[r][k], count, r, op, name, n) for r in range(n)]
        for r in range(n):
            ranks.launch(r, dt, op, bufs[r][0], bufs[r][1], count, pieces[r], fp, K.PUBLISH, epoch=k + 1)
        for r in range(n):
            ranks.launch(r, dt, op, bufs[r][0], bufs[r][1], count, pieces[r], fp, K.CONSUME, epoch=k + 1)
    for r in range(n):
        np.testing.assert_array_equal(bufs[r][1], want[r], err_msg=f"{name} rank {r}")
        assert not ranks.err[r].any()


def _threads(n: int, body) -> list[BaseException]:
    errors: list[BaseException] = []

    def run(r: int) -> None:
        try:
            body(r)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    return errors


@pytest.mark.parametrize("n", [2, 3, 4])
def test_spin_form_ops_in_a_row_on_threads_are_exact_and_the_flags_only_count_up(n):
    """Each thread is one rank's stream: 40 all_reduces of growing length, in one launch each (publish,
    release the epoch, wait for the peers', reduce), the epoch taken from the rank's own flag words."""
    dt, grid, ops = np.dtype(np.int64), 4, 40
    ranks = Ranks(n, 64 * dt.itemsize)
    got: dict[tuple[int, int], np.ndarray] = {}

    def rank(r: int) -> None:
        for k in range(ops):
            count = 1 + k % 60
            inp = np.arange(count, dtype=dt) * (r + 1) + k
            out = np.full(count, -1, dt)
            step = plans.ipc_pieces("all_reduce", r, n, 0, count, 64)[0]
            p = lower(step, count, r, ReduceOp.SUM, "all_reduce", n)
            ranks.launch(r, dt, ReduceOp.SUM, inp, out, count, p, fingerprint(1, 9, 1, count, 0), ALL, grid=grid)
            got[r, k] = out

    assert _threads(n, rank) == []
    for k in range(ops):
        count = 1 + k % 60
        want = sum(np.arange(count, dtype=dt) * (r + 1) + k for r in range(n))
        for r in range(n):
            np.testing.assert_array_equal(got[r, k], want, err_msg=f"op {k} rank {r}")
    for r in range(n):
        assert list(ranks.flags(r, grid)) == [ops] * grid and not ranks.err[r].any()


def test_a_rank_that_never_arrives_ends_the_wait_at_the_deadline_with_its_name_and_no_output():
    ranks = Ranks(3, 256)
    dt = np.dtype(np.float32)
    outs = [np.full(4, 7, dt) for _ in range(3)]
    p = Piece(0, 4, 1, 0, 3, 0, 0, 0)

    def rank(r: int) -> None:
        if r != 2:  # rank 2 never launches
            ranks.launch(r, dt, ReduceOp.SUM, np.ones(4, dt), outs[r], 4, p, 5, ALL, timeout_s=0.2)

    assert _threads(3, rank) == []
    for r in (0, 1):
        code, peer, epoch, kind = ranks.err[r]
        assert (code, peer, epoch, kind) == (K.ERR_TIMEOUT, 2, 1, 1)
        np.testing.assert_array_equal(outs[r], np.full(4, 7, dt))  # untouched


def test_different_calls_are_caught_on_every_rank_by_their_fingerprints():
    ranks = Ranks(2, 256)
    dt = np.dtype(np.int32)
    outs = [np.full(3, 9, dt) for _ in range(2)]
    fps = [fingerprint(1, dtype_code(dt), 1, 3 + r, 0) for r in range(2)]
    assert unpack_fingerprint(fps[1]) == (1, dtype_code(dt), 1, 4, 0)

    def rank(r: int) -> None:
        ranks.launch(r, dt, ReduceOp.SUM, np.ones(3, dt), outs[r], 3, Piece(0, 3, 1, 0, 2, 0, 0, 0), fps[r], ALL)

    assert _threads(2, rank) == []
    for r in range(2):
        assert (ranks.err[r][0], ranks.err[r][1]) == (K.ERR_MISMATCH, 1 - r)
        np.testing.assert_array_equal(outs[r], np.full(3, 9, dt))


SMALL_DTYPES = (np.int8, np.float16, np.int32, np.float32, np.int64, np.float64)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_small_all_reduces_between_piece_ops_on_threads_are_exact_and_share_the_epochs(n):
    """gpu_small.cu's meaning: ops in a row alternate with the piece kernel's on every rank's stream (a
    thread), every dtype of each size, counts that fill lines partly and up to the most (4088 bytes); each
    takes the next epoch from the flag words, which it leaves at its own for the next piece kernel."""
    grid, ops = 4, 36
    ranks = Ranks(n, 4096)
    got: dict[tuple[int, int], np.ndarray] = {}

    def case(k: int) -> tuple[np.dtype, int, ReduceOp, bool]:
        dt = np.dtype(SMALL_DTYPES[k % len(SMALL_DTYPES)])
        count = (1, 3, 7, 13, K.SMALL_MAX_BYTES // dt.itemsize)[k % 5]
        return dt, count, (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.AVG)[k % 3], k % 4 != 3

    def rank(r: int) -> None:
        for k in range(ops):
            dt, count, op, small = case(k)
            count = min(count, 4096 // dt.itemsize)
            inp = ((np.arange(count) + 3 * r + k) % 5 * n).astype(dt)
            out = np.full(count, -1, dt)
            step = plans.ipc_pieces("all_reduce", r, n, 0, count, 4096 // dt.itemsize)[0]
            p = lower(step, count, r, op, "all_reduce", n)
            ranks.launch(r, dt, op, inp, out, count, p, fingerprint(1, dtype_code(dt), op.code, count, 0), ALL,
                         grid=1 if small else grid, small=small)
            got[r, k] = out

    assert _threads(n, rank) == []
    for k in range(ops):
        dt, count, op, _ = case(k)
        count = min(count, 4096 // dt.itemsize)
        ins = [((np.arange(count) + 3 * r + k) % 5 * n).astype(dt) for r in range(n)]
        want = np.maximum.reduce(ins) if op is ReduceOp.MAX else sum(ins[1:], ins[0])
        if op is ReduceOp.AVG:
            want = (want / n).astype(dt) if dt.kind == "f" else want // n
        for r in range(n):
            np.testing.assert_array_equal(got[r, k], want, err_msg=f"op {k} ({dt}, {count}, {op}) rank {r}")
    for r in range(n):
        assert list(ranks.flags(r, grid)) == [ops] * grid and not ranks.err[r].any()


def test_a_small_all_reduce_fails_at_the_deadline_or_on_another_call_and_writes_nothing():
    """A rank that never comes: the others give up at the deadline naming it. A rank whose op at this epoch
    is a piece kernel's (no lines will come): caught by its flag and fingerprint, on both sides."""
    dt = np.dtype(np.float32)
    ranks = Ranks(3, 256)
    outs = [np.full(4, 7, dt) for _ in range(3)]
    p = Piece(0, 4, 1, 0, 3, 0, 0, 0)

    def absent(r: int) -> None:
        if r != 2:
            ranks.launch(r, dt, ReduceOp.SUM, np.ones(4, dt), outs[r], 4, p, 5, ALL, grid=1, timeout_s=0.2, small=True)

    assert _threads(3, absent) == []
    for r in (0, 1):
        assert tuple(ranks.err[r]) == (K.ERR_TIMEOUT, 2, 1, 1)
        np.testing.assert_array_equal(outs[r], np.full(4, 7, dt))
    ranks = Ranks(2, 256)
    outs = [np.full(4, 7, dt) for _ in range(2)]
    p2 = Piece(0, 4, 1, 0, 2, 0, 0, 0)

    def other(r: int) -> None:  # rank 0 a small all_reduce, rank 1 the piece kernel of another call
        ranks.launch(r, dt, ReduceOp.SUM, np.ones(4, dt), outs[r], 4, p2, 5 + r, ALL, grid=1 if r == 0 else 4,
                     timeout_s=5, small=r == 0)

    assert _threads(2, other) == []
    for r in range(2):
        assert (ranks.err[r][0], ranks.err[r][1]) == (K.ERR_MISMATCH, 1 - r)
        np.testing.assert_array_equal(outs[r], np.full(4, 7, dt))
