"""The cost model: exact where it claims to be, and the tuner within 10% of the best simulated algorithm."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from aioccl.algorithms import ALGORITHMS, plan
from aioccl.algorithms.cost import LINKS, chain_time, lockstep, predict, ring_reduce_time, simulate
from aioccl.tuning import Tuning

from conftest import ROOT

SMALL_RANKS = [2, 3, 4, 5, 8, 13, 16]
COUNTS = [1, 7, 1000, 1 << 16, 3 << 18, 1 << 22]
CHUNK = 1 << 16


def des(coll: str, algo: str, count: int, n: int, link) -> float:
    return simulate([plan(coll, count, r, n, 0, CHUNK, algo) for r in range(n)], link, 4)


@pytest.mark.parametrize("link", LINKS.values(), ids=list(LINKS))
@pytest.mark.parametrize("n", SMALL_RANKS)
def test_fast_forms_equal_the_event_simulation(link, n):
    for count in [*COUNTS, n * 4096, n * CHUNK * 3]:
        # exact when the count divides evenly; otherwise ranks differ by one element per step
        rel = 1e-12 if count % n == 0 else 1e-2
        for coll in ("all_reduce", "reduce_scatter", "all_gather"):
            assert lockstep(plan(coll, count, 0, n, 0, CHUNK, "ring"), link, 4) == pytest.approx(
                des(coll, "ring", count, n, link), rel=rel), (coll, count)
        if n & (n - 1) == 0:
            assert lockstep(plan("all_reduce", count, 0, n, 0, CHUNK, "rd"), link, 4) == pytest.approx(
                des("all_reduce", "rd", count, n, link), rel=1e-12)
        assert chain_time(count, n, CHUNK, link, 4) == pytest.approx(des("broadcast", "chain", count, n, link),
                                                                        rel=1e-12)
        # exact for one piece; with several, the root's incast overlaps the next pieces: an upper bound
        exact, bound = des("reduce", "ring", count, n, link), ring_reduce_time(count, n, CHUNK, link, 4)
        if count <= n * CHUNK:
            assert bound == pytest.approx(exact, rel=rel), count
        else:
            assert exact * (1 - 1e-12) <= bound <= 1.35 * exact, count


def test_buckets_are_quarter_octaves():
    from aioccl.tuning import bucket

    assert [bucket(c) for c in (1, 8, 9, 16, 17, 20, 1000)] == [1, 8, 9, 16, 19, 22, 1024]
    assert all(c <= bucket(c) <= 1.19 * c + 1 for c in range(1, 5000))


def test_model_basics():
    link = LINKS["100g"]
    # one message of S bytes between two ranks: alpha + S*beta (+ the root's local copy)
    s = 1 << 20
    assert des("broadcast", "tree", s // 4, 2, link) == pytest.approx(link.alpha + s * link.beta + s * link.mem_beta)
    # an incast serializes at the receiver: gathering 7 blocks takes 7 transfers of time
    # (the root's own copy overlaps the transfers)
    t = simulate([plan("gather", s // 4, r, 8, 0, CHUNK, "direct") for r in range(8)], link, 4)
    assert t == pytest.approx(link.alpha + 7 * s * link.beta)


GRID_SIZES = [8, 100, 4096, 48 << 10, 1 << 20, 3 << 20, 64 << 20, 1 << 30]
GRID = [(n, link) for n in (2, 3, 4, 5, 8, 13, 16, 64) for link in LINKS] + \
       [(n, link) for n in (512, 4096) for link in ("tcp", "100g", "400g")]


@pytest.mark.parametrize("n,link", GRID)
def test_tuner_within_10_percent_of_the_best_simulated_algorithm(n, link):
    tuning = Tuning(link=LINKS[link])
    for coll in ("all_reduce", "reduce", "broadcast"):
        for size in GRID_SIZES:
            count = max(1, size // 4)
            times = {a: predict(coll, a, count, n, LINKS[link], 4, tuning.chunk(4)) for a in ALGORITHMS[coll]}
            chosen = tuning.choose(coll, count, 4, n)[0]
            assert times[chosen] <= 1.10 * min(times.values()), (coll, size, n, link, chosen, times)


def test_sim_cli(tmp_path):
    out = tmp_path / "s.json"
    p = subprocess.run([sys.executable, "-m", "aioccl.tools.sim", "broadcast", "--link", "200g", "--ranks",
                        "4,4096", "--sizes", "8,1M,1G", "--json", str(out)], capture_output=True, text=True,
                       timeout=120, env={"PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stdout.splitlines() if not ln.startswith("#")]
    assert len(lines) == 6 and all(ln.count("*") == 1 for ln in lines)
    report = json.loads(out.read_text())
    assert {r["ranks"] for r in report["rows"]} == {4, 4096} and report["link"]["name"] == "200g"
    listing = subprocess.run([sys.executable, "-m", "aioccl.tools.sim", "--links"], capture_output=True, text=True,
                             timeout=60, env={"PYTHONPATH": str(ROOT)})
    assert all(name in listing.stdout for name in LINKS)
