"""Every schedule, run in-process for 1..16 ranks against a plain numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

from aioccl.algorithms import ALGORITHMS, plan
from aioccl.algorithms.reference import run

RANKS = list(range(1, 17))
COUNTS = [0, 1, 7, 64, 257]
CHUNK = 5  # tiny chunk: exercises many pieces


def data(rank: int, count: int) -> np.ndarray:
    return ((np.arange(count) * 3 + rank * 7) % 11).astype(np.float64)


def poison(count: int) -> np.ndarray:
    return np.full(count, np.nan)


@pytest.mark.parametrize("algo", ALGORITHMS["all_reduce"])
@pytest.mark.parametrize("n", RANKS)
@pytest.mark.parametrize("in_place", [False, True])
def test_all_reduce(algo, n, in_place):
    for count in COUNTS:
        ins = [data(r, count) for r in range(n)]
        expect = np.sum(ins, axis=0)
        outs = [x.copy() for x in ins] if in_place else [poison(count) for _ in range(n)]
        run([plan("all_reduce", count, r, n, 0, CHUNK, algo) for r in range(n)], ins, outs, in_place=in_place)
        for r in range(n):
            np.testing.assert_array_equal(outs[r], expect / n, err_msg=f"rank {r} count {count}")


@pytest.mark.parametrize("algo", ALGORITHMS["reduce"])
@pytest.mark.parametrize("n", RANKS)
def test_reduce(algo, n):
    for count in COUNTS:
        for root in sorted({0, n - 1, n // 2}):
            ins = [data(r, count) for r in range(n)]
            saved = [x.copy() for x in ins]
            outs = [poison(count) for _ in range(n)]
            run([plan("reduce", count, r, n, root, CHUNK, algo) for r in range(n)], ins, outs)
            np.testing.assert_array_equal(outs[root], np.sum(ins, axis=0) / n)
            for r in range(n):
                np.testing.assert_array_equal(ins[r], saved[r])
                if r != root:
                    assert np.isnan(outs[r]).all(), "non-root output must stay untouched"


@pytest.mark.parametrize("algo", ALGORITHMS["broadcast"])
@pytest.mark.parametrize("n", RANKS)
def test_broadcast(algo, n):
    for count in COUNTS:
        for root in sorted({0, n - 1, n // 2}):
            bufs = [data(root, count) if r == root else poison(count) for r in range(n)]
            run([plan("broadcast", count, r, n, root, CHUNK, algo) for r in range(n)], bufs, bufs, in_place=True)
            for r in range(n):
                np.testing.assert_array_equal(bufs[r], data(root, count))
            ins = [data(root, count) if r == root else poison(count) for r in range(n)]
            outs = [poison(count) for _ in range(n)]
            run([plan("broadcast", count, r, n, root, CHUNK, algo) for r in range(n)], ins, outs)
            for r in range(n):
                np.testing.assert_array_equal(outs[r], data(root, count))
            np.testing.assert_array_equal(ins[root], data(root, count))


@pytest.mark.parametrize("n", RANKS)
def test_all_gather_and_gather(n):
    for block in COUNTS:
        ins = [data(r, block) for r in range(n)]
        outs = [poison(n * block) for _ in range(n)]
        run([plan("all_gather", block, r, n, 0, CHUNK, "ring") for r in range(n)], ins, outs)
        for r in range(n):
            np.testing.assert_array_equal(outs[r], np.concatenate(ins))
        root = n - 1
        outs = [poison(n * block) for _ in range(n)]
        run([plan("gather", block, r, n, root, CHUNK, "direct") for r in range(n)], ins, outs)
        np.testing.assert_array_equal(outs[root], np.concatenate(ins))


@pytest.mark.parametrize("n", RANKS)
def test_reduce_scatter(n):
    for block in COUNTS:
        ins = [data(r, n * block) for r in range(n)]
        saved = [x.copy() for x in ins]
        outs = [poison(block) for _ in range(n)]
        run([plan("reduce_scatter", block, r, n, 0, CHUNK, "ring") for r in range(n)], ins, outs)
        total = np.sum(ins, axis=0) / n
        for r in range(n):
            np.testing.assert_array_equal(outs[r], total[r * block:(r + 1) * block])
            np.testing.assert_array_equal(ins[r], saved[r])


@pytest.mark.parametrize("n", RANKS)
@pytest.mark.parametrize("in_place", [False, True])
def test_scatter_and_all_to_all(n, in_place):
    for block in COUNTS:
        root = n // 2
        src = data(root, n * block)
        ins = [src if r == root else poison(n * block) for r in range(n)]
        outs = [poison(block) for _ in range(n)]
        run([plan("scatter", block, r, n, root, CHUNK, "direct") for r in range(n)], ins, outs)
        for r in range(n):
            np.testing.assert_array_equal(outs[r], src[r * block:(r + 1) * block])
        ins = [data(r, n * block) for r in range(n)]
        outs = [x.copy() for x in ins] if in_place else [poison(n * block) for _ in range(n)]
        run([plan("all_to_all", block, r, n, 0, CHUNK, "direct", in_place) for r in range(n)],
            ins, outs, in_place=in_place)
        for r in range(n):
            want = np.concatenate([ins[j][r * block:(r + 1) * block] for j in range(n)])
            np.testing.assert_array_equal(outs[r], want)


@pytest.mark.parametrize("n", RANKS)
def test_barrier_pairs_up(n):
    empty = [np.zeros(0) for _ in range(n)]
    run([plan("barrier", 0, r, n, 0, CHUNK, "dissemination") for r in range(n)], empty, empty)
    assert len(plan("barrier", 0, 0, n, 0, CHUNK, "dissemination").steps) == (n - 1).bit_length()


@pytest.mark.parametrize("n", RANKS)
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("op", ["sum", "max"])
def test_scan_folds_in_rank_order(n, in_place, op):
    """Rank r gets x_0 op ... op x_r, folded left to right like a loop (the reference scales every
    ``scale`` region, as for avg: by the schedule's divisor, r + 1)."""
    ufunc = np.maximum if op == "max" else np.add
    for count in COUNTS:
        ins = [data(r, count) * (1.5 if r % 2 else 1) for r in range(n)]
        outs = [x.copy() for x in ins] if in_place else [poison(count) for _ in range(n)]
        scheds = [plan("scan", count, r, n, 0, CHUNK, "chain") for r in range(n)]
        run(scheds, ins, outs, ufunc=ufunc, in_place=in_place)
        prefix = ins[0].copy()
        for r in range(n):
            if r:
                prefix = ufunc(prefix, ins[r])
            np.testing.assert_array_equal(outs[r], prefix / (r + 1), err_msg=f"rank {r} count {count}")
