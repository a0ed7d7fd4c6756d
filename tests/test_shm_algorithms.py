"""Shared-memory schedules, run in-process in random interleavings against numpy.

:func:`aioccl.algorithms.reference.run` lets any rank move whenever the
engine's rules allow it, stages into slot halves that later steps really
overwrite, and exposes registered ranks' live buffers, so a schedule that
reads stale or overwritten data fails here, not only one that miscomputes.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from aioccl.algorithms.reference import ScheduleError, run
from aioccl.algorithms.schedule import Schedule, Step
from aioccl.algorithms.shm import SHM_ALGORITHMS, shm_plan

RANKS = [1, 2, 3, 4, 5, 8]
COUNTS = [0, 1, 7, 64, 257]
CAPS = [8, 64]  # slot half in elements: tiny, so ops run in many chunks
SEEDS = [None, 1, 2]


def data(rank: int, count: int) -> np.ndarray:
    return ((np.arange(count) * 3 + rank * 7) % 11).astype(np.float64)


def poison(count: int) -> np.ndarray:
    return np.full(count, np.nan)


def registrations(n: int) -> list[tuple[bool, ...]]:
    return [(False,) * n, (True,) * n, tuple(r % 2 == 0 for r in range(n))]


def cases(n: int):
    return itertools.product(COUNTS, CAPS, registrations(n), SEEDS)


@pytest.mark.parametrize("algo", SHM_ALGORITHMS["all_reduce"])
@pytest.mark.parametrize("n", RANKS)
@pytest.mark.parametrize("in_place", [False, True])
def test_all_reduce(algo, n, in_place):
    for count, cap, reg, seed in cases(n):
        ins = [data(r, count) for r in range(n)]
        expect = np.sum(ins, axis=0) / n
        outs = [x.copy() for x in ins] if in_place else [poison(count) for _ in range(n)]
        scheds = [shm_plan("all_reduce", count, r, n, 0, cap, algo, in_place) for r in range(n)]
        run(scheds, ins, outs, cap, in_place=in_place, registered=reg, seed=seed)
        for r in range(n):
            np.testing.assert_array_equal(outs[r], expect, err_msg=f"rank {r} count {count} cap {cap} {reg} {seed}")
            if not in_place:
                np.testing.assert_array_equal(ins[r], data(r, count))


@pytest.mark.parametrize("algo", SHM_ALGORITHMS["reduce"])
@pytest.mark.parametrize("n", RANKS)
def test_reduce(algo, n):
    for count, cap, reg, seed in cases(n):
        for root in sorted({0, n - 1}):
            ins = [data(r, count) for r in range(n)]
            outs = [poison(count) for _ in range(n)]
            run([shm_plan("reduce", count, r, n, root, cap, algo) for r in range(n)], ins, outs, cap,
                    registered=reg, seed=seed)
            np.testing.assert_array_equal(outs[root], np.sum(ins, axis=0) / n)
            for r in range(n):
                np.testing.assert_array_equal(ins[r], data(r, count))
                if r != root:
                    assert np.isnan(outs[r]).all(), "non-root output must stay untouched"


@pytest.mark.parametrize("n", RANKS)
def test_broadcast(n):
    for count, cap, reg, seed in cases(n):
        for root in sorted({0, n - 1}):
            bufs = [data(root, count) if r == root else poison(count) for r in range(n)]
            run([shm_plan("broadcast", count, r, n, root, cap, in_place=True) for r in range(n)], bufs, bufs,
                    cap, in_place=True, registered=reg, seed=seed)
            for r in range(n):
                np.testing.assert_array_equal(bufs[r], data(root, count))


@pytest.mark.parametrize("n", RANKS)
def test_all_gather_and_gather(n):
    for block, cap, reg, seed in cases(n):
        ins = [data(r, block) for r in range(n)]
        outs = [poison(n * block) for _ in range(n)]
        run([shm_plan("all_gather", block, r, n, 0, cap) for r in range(n)], ins, outs, cap,
                registered=reg, seed=seed)
        for r in range(n):
            np.testing.assert_array_equal(outs[r], np.concatenate(ins))
        # in place: each rank's input is its own block of the output
        outs = [poison(n * block) for _ in range(n)]
        for r in range(n):
            outs[r][r * block:(r + 1) * block] = data(r, block)
        views = [outs[r][r * block:(r + 1) * block] for r in range(n)]
        run([shm_plan("all_gather", block, r, n, 0, cap, in_place=True) for r in range(n)], views, outs, cap,
                registered=reg, seed=seed)
        for r in range(n):
            np.testing.assert_array_equal(outs[r], np.concatenate(ins))
        root = n - 1
        outs = [poison(n * block) for _ in range(n)]
        run([shm_plan("gather", block, r, n, root, cap) for r in range(n)], ins, outs, cap,
                registered=reg, seed=seed)
        np.testing.assert_array_equal(outs[root], np.concatenate(ins))
        for r in range(n - 1):
            assert np.isnan(outs[r]).all()


@pytest.mark.parametrize("n", RANKS)
def test_reduce_scatter(n):
    for block, cap, reg, seed in cases(n):
        ins = [data(r, n * block) for r in range(n)]
        full = np.sum(ins, axis=0) / n
        outs = [poison(block) for _ in range(n)]
        run([shm_plan("reduce_scatter", block, r, n, 0, cap) for r in range(n)], ins, outs, cap,
                registered=reg, seed=seed)
        for r in range(n):
            np.testing.assert_array_equal(outs[r], full[r * block:(r + 1) * block])
        # in place: the output is this rank's block of its own input
        whole = [data(r, n * block) for r in range(n)]
        views = [whole[r][r * block:(r + 1) * block] for r in range(n)]
        run([shm_plan("reduce_scatter", block, r, n, 0, cap) for r in range(n)], whole, views, cap,
                registered=reg, seed=seed)
        for r in range(n):
            np.testing.assert_array_equal(views[r], full[r * block:(r + 1) * block])


@pytest.mark.parametrize("n", RANKS)
def test_scatter_and_all_to_all(n):
    for block, cap, reg, seed in cases(n):
        root = n // 2
        src = data(root, n * block)
        ins = [src if r == root else poison(n * block) for r in range(n)]
        outs = [poison(block) for _ in range(n)]
        run([shm_plan("scatter", block, r, n, root, cap) for r in range(n)], ins, outs, cap,
                registered=reg, seed=seed)
        for r in range(n):
            np.testing.assert_array_equal(outs[r], src[r * block:(r + 1) * block])
        ins = [data(r, n * block) for r in range(n)]
        want = [np.concatenate([ins[j][r * block:(r + 1) * block] for j in range(n)]) for r in range(n)]
        outs = [poison(n * block) for _ in range(n)]
        run([shm_plan("all_to_all", block, r, n, 0, cap) for r in range(n)], ins, outs, cap,
                registered=reg, seed=seed)
        for r in range(n):
            np.testing.assert_array_equal(outs[r], want[r])
        bufs = [x.copy() for x in ins]
        run([shm_plan("all_to_all", block, r, n, 0, cap, in_place=True) for r in range(n)], bufs, bufs, cap,
                in_place=True, registered=reg, seed=seed)
        for r in range(n):
            np.testing.assert_array_equal(bufs[r], want[r])


@pytest.mark.parametrize("n", RANKS)
def test_barrier(n):
    for seed in SEEDS:
        run([shm_plan("barrier", 0, r, n, 0, 8) for r in range(n)], [poison(0)] * n, [poison(0)] * n, 8,
                seed=seed)


def test_the_bench_catches_unsafe_zero_copy():
    """Flat all_reduce in place must stage: if it claimed zero-copy, ranks would read overwritten inputs."""
    n, count, cap = 3, 16, 64
    unsafe = [Schedule(shm_plan("all_reduce", count, r, n, 0, cap, "flat", True).steps, 0, True, "flat")
              for r in range(n)]
    bufs = [data(r, count) for r in range(n)]
    expect = np.sum(bufs, axis=0) / n
    run(unsafe, bufs, bufs, cap, in_place=True, registered=(True,) * n)
    assert not all(np.array_equal(b, expect) for b in bufs)


def test_the_bench_catches_bad_slots_and_deadlocks():
    n = 2
    good = [shm_plan("all_gather", 4, r, n, 0, 8) for r in range(n)]
    with pytest.raises(ScheduleError, match="does not fit"):
        run(good, [data(r, 4) for r in range(n)], [poison(8) for _ in range(n)], 2)
    lopsided = [good[0], Schedule(good[1].steps + (Step(lockstep=True),))]
    with pytest.raises(ScheduleError, match="disagree"):
        run(lopsided, [data(r, 4) for r in range(n)], [poison(8) for _ in range(n)], 8)


def test_every_step_fits_the_slot():
    for coll, count, n, cap in itertools.product(("all_reduce", "reduce", "reduce_scatter", "all_to_all", "scatter",
                                                  "all_gather", "gather", "broadcast"), (1, 100, 1000), (2, 5),
                                                 (16, 100)):
        for algo in SHM_ALGORITHMS[coll]:
            for r in range(n):
                for step in shm_plan(coll, count, r, n, n - 1, cap, algo).steps:
                    assert all(st.slot >= 0 and st.slot + st.src.count <= cap for st in step.stage), (coll, algo)
