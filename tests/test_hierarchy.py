"""Hierarchical schedules (ranks on several hosts), run in-process against numpy: uneven hosts, one rank per
host, interleaved host numbering, every root, in place and not."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from aioccl.algorithms import plan
from aioccl.algorithms.hierarchy import HIERARCHICAL, hosts_of, spans_hosts, uniform
from aioccl.algorithms.reference import run

COUNTS = [0, 1, 7, 64, 257]
CHUNK = 5
LAYOUTS = {
    "2x2": (0, 0, 1, 1),
    "3+1+2": (0, 0, 0, 1, 2, 2),
    "1 per host": (0, 1, 2, 3),
    "interleaved 3x2": (0, 1, 2, 0, 1, 2),
    "4x3": (0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3),
    "one host": (0, 0, 0),
    "hosts not numbered by first rank": (2, 0, 2, 1, 0, 1),
}


def data(rank: int, count: int) -> np.ndarray:
    return ((np.arange(count) * 3 + rank * 7) % 11).astype(np.float64)


def poison(count: int) -> np.ndarray:
    return np.full(count, np.nan)


def algos(coll: str, layout: tuple[int, ...]) -> list[str]:
    return [a for a in HIERARCHICAL[coll] if a != "rail" or uniform(layout)]


def test_layout_helpers():
    assert hosts_of((1, 0, 1, 2)) == [[0, 2], [1], [3]]
    assert spans_hosts((0, 0, 1)) and not spans_hosts((0, 1, 2)) and not spans_hosts((0, 0))
    assert uniform((0, 1, 0, 1)) and not uniform((0, 0, 1))
    with pytest.raises(ValueError, match="same number of ranks"):
        plan("all_reduce", 4, 0, 3, 0, CHUNK, "rail", layout=(0, 0, 1))


@pytest.mark.parametrize("name", LAYOUTS)
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("seed", [None, 1, 2])
def test_all_reduce(name, in_place, seed):
    layout = LAYOUTS[name]
    n = len(layout)
    for algo in algos("all_reduce", layout):
        for count in COUNTS:
            for chunk in (CHUNK, 10_000):  # many pieces (bandwidth phases) and one (latency phases)
                ins = [data(r, count) for r in range(n)]
                expect = np.sum(ins, axis=0) / n
                outs = [x.copy() for x in ins] if in_place else [poison(count) for _ in range(n)]
                scheds = [plan("all_reduce", count, r, n, 0, chunk, algo, layout=layout) for r in range(n)]
                run(scheds, ins, outs, in_place=in_place, seed=seed)
                for r in range(n):
                    np.testing.assert_array_equal(outs[r], expect, err_msg=f"{algo} rank {r} count {count}")


@pytest.mark.parametrize("name", LAYOUTS)
@pytest.mark.parametrize("seed", [None, 3])
def test_reduce_every_root(name, seed):
    layout = LAYOUTS[name]
    n = len(layout)
    for count, chunk, root in itertools.product(COUNTS, (CHUNK, 10_000), range(n)):
        ins = [data(r, count) for r in range(n)]
        saved = [x.copy() for x in ins]
        outs = [poison(count) for _ in range(n)]
        run([plan("reduce", count, r, n, root, chunk, "leader", layout=layout) for r in range(n)], ins, outs, seed=seed)
        np.testing.assert_array_equal(outs[root], np.sum(ins, axis=0) / n)
        for r in range(n):
            np.testing.assert_array_equal(ins[r], saved[r])
            if r != root:
                assert np.isnan(outs[r]).all(), "non-root output must stay untouched"


@pytest.mark.parametrize("name", LAYOUTS)
@pytest.mark.parametrize("in_place", [False, True])
def test_broadcast_every_root(name, in_place):
    n = len(LAYOUTS[name])
    for count, chunk, root in itertools.product(COUNTS, (CHUNK, 10_000), range(n)):
        ins = [data(root, count) if r == root else poison(count) for r in range(n)]
        outs = ins if in_place else [poison(count) for _ in range(n)]
        scheds = [plan("broadcast", count, r, n, root, chunk, "leader", layout=LAYOUTS[name]) for r in range(n)]
        run(scheds, ins, outs, in_place=in_place, seed=root)
        for r in range(n):
            np.testing.assert_array_equal(outs[r], data(root, count), err_msg=f"root {root} rank {r}")
        np.testing.assert_array_equal(ins[root], data(root, count))


def test_rail_crosses_hosts_with_a_fraction_of_the_flat_ring():
    """What the hierarchy is for: bytes each rank sends to other hosts, 4 hosts x 4 ranks, 1 MiElements."""
    layout = tuple(r // 4 for r in range(16))
    count, chunk = 1 << 20, 1 << 18

    def crossing(algo: str) -> int:
        s = plan("all_reduce", count, 0, 16, 0, chunk, algo, layout=layout)
        return sum(x.src.count for st in s.steps for x in st.sends if layout[x.peer] != layout[0])

    flat = plan("all_reduce", count, 3, 16, 0, chunk, "ring")  # rank 3's right neighbour is on host 1
    flat_cross = sum(x.src.count for st in flat.steps for x in st.sends)
    assert crossing("rail") * 4 <= flat_cross * 1.01


def blockwise(coll: str, layout: tuple[int, ...], seed: int | None, inputs, out_len):
    """Run ``coll`` for every algorithm, block size and chunk on ``layout``; yield what each run had and made."""
    n = len(layout)
    for algo in algos(coll, layout):
        for block in (0, 1, 3, 40):
            for chunk in (CHUNK, 10_000):
                ins = inputs(n, block)
                outs = [poison(out_len(n, block)) for _ in range(n)]
                run([plan(coll, block, r, n, 0, chunk, algo, layout=layout) for r in range(n)], ins, outs, seed=seed)
                yield algo, block, ins, outs


@pytest.mark.parametrize("name", LAYOUTS)
@pytest.mark.parametrize("seed", [None, 4])
def test_all_gather(name, seed):
    layout = LAYOUTS[name]
    cases = blockwise("all_gather", layout, seed, lambda n, b: [data(r, b) for r in range(n)], lambda n, b: n * b)
    for algo, block, ins, outs in cases:
        for r in range(len(layout)):
            np.testing.assert_array_equal(outs[r], np.concatenate(ins), err_msg=f"{algo} rank {r}")
            np.testing.assert_array_equal(ins[r], data(r, block))


@pytest.mark.parametrize("name", LAYOUTS)
@pytest.mark.parametrize("seed", [None, 5])
def test_reduce_scatter(name, seed):
    layout = LAYOUTS[name]
    n = len(layout)
    cases = blockwise("reduce_scatter", layout, seed, lambda n, b: [data(r, n * b) for r in range(n)], lambda n, b: b)
    for algo, block, ins, outs in cases:
        full = np.sum(ins, axis=0) / n
        for r in range(n):
            np.testing.assert_array_equal(outs[r], full[r * block:(r + 1) * block], err_msg=f"{algo} rank {r}")
            np.testing.assert_array_equal(ins[r], data(r, n * block), err_msg="input intact")
