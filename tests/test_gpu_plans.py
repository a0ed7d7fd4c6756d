"""The same-host GPU plans (publish to scratch, barrier, consume from peers), run with numpy.

Every op, 1-4 ranks, scratch sizes that force many pieces, in and out of
place: the plans that run on cupy arrays over CUDA IPC are the ones checked
here, with numpy arrays standing in for the scratch buffers.
"""

from __future__ import annotations

import numpy as np
import pytest

from aioccl.dtypes import ReduceOp
from aioccl.gpu.plans import consume, divisor, ipc_pieces, publish, reads_input, stage_pieces, writes_output
from aioccl.kernels import cpu

OPS = ["all_reduce", "reduce", "broadcast", "all_gather", "gather", "reduce_scatter", "scatter", "all_to_all", "scan"]
POISON = -7


def _inputs(name: str, n: int, count: int) -> list[np.ndarray]:
    size = count * n if name in ("reduce_scatter", "scatter", "all_to_all") else count
    return [(np.arange(size) % 13 + 3 * r + 1).astype(np.float32) for r in range(n)]


def _expected(name: str, ins: list[np.ndarray], r: int, root: int, count: int, op: ReduceOp) -> np.ndarray | None:
    n = len(ins)
    if name == "scan":  # the prefix over ranks 0..r, averaged over the r + 1 ranks it covers
        prefix = ins[0].copy()
        for x in ins[1:r + 1]:
            cpu.combine(op, prefix, prefix, x)
        cpu.scale(op, prefix, r + 1)
        return prefix
    total = ins[0].copy()
    for x in ins[1:]:
        cpu.combine(op, total, total, x)
    cpu.scale(op, total, n)
    if name == "all_reduce":
        return total
    if name == "reduce":
        return total if r == root else None
    if name == "broadcast":
        return ins[root]
    if name == "all_gather":
        return np.concatenate(ins)
    if name == "gather":
        return np.concatenate(ins) if r == root else None
    if name == "reduce_scatter":
        return total[r * count:(r + 1) * count]
    if name == "scatter":
        return ins[root][r * count:(r + 1) * count]
    if name == "all_to_all":
        return np.concatenate([ins[i][r * count:(r + 1) * count] for i in range(n)])
    raise AssertionError(name)


def _out_size(name: str, n: int, count: int) -> int:
    return {"all_gather": n * count, "gather": n * count, "all_to_all": n * count}.get(name, count)


def _copy(d: np.ndarray, s: np.ndarray) -> None:
    d[...] = s


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("cap", [4, 5, 64])
@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.MAX, ReduceOp.AVG], ids=lambda o: o.value)
def test_ipc_plans_compute_every_op(name, n, cap, op):
    if cap < n and name in ("reduce_scatter", "scatter", "all_to_all"):
        cap = n
    count, root = 11, n - 1
    ins = _inputs(name, n, count)
    outs = [np.full(_out_size(name, n, count), POISON, dtype=np.float32) for _ in range(n)]
    plans = [ipc_pieces(name, r, n, root, count, cap) for r in range(n)]
    assert len({len(p) for p in plans}) == 1, "every rank must run the same number of pieces (barriers pair up)"
    scratches = [np.full(cap, POISON, dtype=np.float32) for _ in range(n)]
    for k in range(len(plans[0])):
        for r in range(n):
            scratches[r][:] = POISON  # nothing may survive from an earlier piece
            publish(plans[r][k], ins[r], scratches[r], _copy)
            assert bool(plans[r][k].stage) == reads_input(name, r, root)
        for r in range(n):  # after the barrier: everyone reads everyone's scratch
            consume(plans[r][k], outs[r], scratches, _copy, lambda d, a, b: cpu.combine(op, d, a, b),
                    lambda d, r=r: cpu.scale(op, d, divisor(name, r, n)))
    for r in range(n):
        want = _expected(name, ins, r, root, count, op if name in ("all_reduce", "reduce", "reduce_scatter", "scan")
                         else ReduceOp.SUM)
        if want is None:
            assert not writes_output(name, r, root)
            assert (outs[r] == POISON).all()
        else:
            np.testing.assert_array_equal(outs[r], want)


@pytest.mark.parametrize("name", ["all_reduce", "all_to_all", "reduce_scatter", "all_gather"])
def test_ipc_plans_in_place(name):
    """The output may be the input (or its own block): publishing copies first, and later pieces read
    only what earlier pieces have not written."""
    n, count, cap = 3, 10, 6
    ins = _inputs(name, n, count)
    originals = [x.copy() for x in ins]
    if name == "all_gather":
        bufs = [np.full(n * count, POISON, dtype=np.float32) for _ in range(n)]
        for r in range(n):
            bufs[r][r * count:(r + 1) * count] = ins[r]
        views_in = [bufs[r][r * count:(r + 1) * count] for r in range(n)]
        views_out = bufs
    elif name == "reduce_scatter":
        views_in = ins
        views_out = [ins[r][r * count:(r + 1) * count] for r in range(n)]
    else:
        views_in = views_out = ins
    plans = [ipc_pieces(name, r, n, 0, count, cap) for r in range(n)]
    scratches = [np.full(cap, POISON, dtype=np.float32) for _ in range(n)]
    for k in range(len(plans[0])):
        for r in range(n):
            publish(plans[r][k], views_in[r], scratches[r], _copy)
        for r in range(n):
            consume(plans[r][k], views_out[r], scratches, _copy, lambda d, a, b: np.add(a, b, out=d), lambda d: None)
    for r in range(n):
        np.testing.assert_array_equal(views_out[r], _expected(name, originals, r, 0, count, ReduceOp.SUM))


def test_scratch_too_small_for_the_blocks_is_refused():
    with pytest.raises(ValueError, match="cannot hold 4 blocks"):
        ipc_pieces("all_to_all", 0, 4, 0, 10, 3)


def test_stage_pieces_split_only_elementwise_ops():
    assert stage_pieces("all_reduce", 10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert stage_pieces("broadcast", 3, 4) == [(0, 3)]
    assert stage_pieces("all_gather", 100, 4) == [(0, 100)]
    assert stage_pieces("all_reduce", 0, 4) == [(0, 0)]
