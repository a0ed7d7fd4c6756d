"""The cost model: exact where it claims to be, and the tuner within 10% of the best simulated algorithm."""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import pytest

import aioccl.tuning
from aioccl.algorithms import ALGORITHMS, plan
from aioccl.algorithms.cost import LINKS, Hosts, chain_time, leader_time, lockstep, predict, ring_reduce_time, simulate
from aioccl.tuning import Tuning, allowed, bucket, candidates

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


@pytest.fixture
def priced(monkeypatch):
    """``predict``, memoized for one test and shared with the tuner: where the tuner's size bucket is the count
    itself, a candidate is priced once, not once here and again when the tuner chooses (seconds at 4096 ranks)."""
    cached = functools.lru_cache(maxsize=None)(predict)
    monkeypatch.setattr(aioccl.tuning, "predict", cached)
    aioccl.tuning.best.cache_clear()  # the tuner prices this test's calls itself, through the shared cache
    yield cached
    aioccl.tuning.best.cache_clear()  # nothing chosen with the patched function outlives the test


GRID_SIZES = [8, 100, 4096, 48 << 10, 1 << 20, 3 << 20, 64 << 20, 1 << 30]
# at 4096 ranks one link (10 s each on 2 cores): the fast links' crossovers are checked at 512
GRID = [(n, link) for n in (2, 3, 4, 5, 8, 13, 16, 64) for link in LINKS] + \
       [(512, link) for link in ("tcp", "100g", "400g")] + [(4096, "100g")]


@pytest.mark.parametrize("n,link", GRID)
def test_tuner_within_10_percent_of_the_best_simulated_algorithm(n, link, priced):
    tuning = Tuning(link=LINKS[link])
    for coll in ("all_reduce", "reduce", "broadcast"):
        for size in GRID_SIZES:
            count = max(1, size // 4)
            times = {a: priced(coll, a, count, n, LINKS[link], 4, tuning.chunk(4)) for a in ALGORITHMS[coll]}
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


HOST_GRID = [((0, 0, 1, 1), "tcp"), ((0, 0, 0, 1, 2, 2), "100g"), (tuple(r // 4 for r in range(16)), "100g"),
             (tuple(r // 8 for r in range(512)), "tcp"), (tuple(r // 8 for r in range(512)), "400g"),
             (tuple(r // 8 for r in range(4096)), "100g")]


@pytest.mark.parametrize("layout,link", HOST_GRID, ids=lambda v: f"{len(v)}r" if isinstance(v, tuple) else v)
def test_tuner_within_10_percent_of_the_best_simulated_algorithm_on_several_hosts(layout, link, priced):
    """Ranks on hosts (same-host link inside, the network across, one NIC per host): flat and hierarchical
    algorithms compete, up to 4096 ranks on 512 hosts x 8."""
    n, tuning = len(layout), Tuning(link=LINKS[link])
    hosts = Hosts(layout)
    for coll in ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter"):
        for size in GRID_SIZES:
            count = max(1, size // 4 // (n if coll in ("all_gather", "reduce_scatter") else 1))
            times = {a: priced(coll, a, count, n, LINKS[link], 4, tuning.chunk(4), hosts)
                     for a in allowed(coll, bucket(count), n, 4, layout)}
            chosen = tuning.choose(coll, count, 4, n, layout)[0]
            assert times[chosen] <= 1.10 * min(times.values()), (coll, size, n, link, chosen, times)
    few = len(set(layout)) <= 4  # with one NIC a host sends 2(H-1)/H of the buffer on rail, 2(n-1)/n on a ring
    if few and LINKS[link].beta > hosts.local.beta:  # and a network slower than shared memory: crossing less pays
        big = {a: predict("all_reduce", a, (1 << 30) // 4, n, LINKS[link], 4, tuning.chunk(4), hosts)
               for a in candidates("all_reduce", layout)}
        assert min(big, key=big.__getitem__) in ("rail", "leader"), big


def test_the_nic_crowd_of_ring_and_rail_from_rank_0s_steps_equals_the_one_from_every_mates_schedule():
    """``nic_crowd`` of a flat ring (from rank 0's steps and the mates' neighbours) and of rail (from rank 0's
    steps: every mate crosses where it does) is worked out without the mates' schedules (the tuner's pricing
    at 4096 ranks built 8 schedules of 4096 ranks per candidate): the same as from each mate's own schedule,
    on hosts of equal sizes (and unequal for the ring; rail refuses them), ranks of a host apart and together,
    one and two NICs, every ring and rail collective, counts below the rank count, one piece and several."""
    from aioccl.algorithms.cost import _crowd, _rail_crowd, _ring_crowd

    layouts = [tuple(r // 4 for r in range(12)), tuple(r // 8 for r in range(32)), (0, 0, 0, 1, 1, 1, 2, 2, 2),
               (0, 1, 0, 1, 0, 1), (0, 0, 0, 1, 2, 2, 2, 2, 3)]
    for layout in layouts:
        n, equal = len(layout), len({layout.count(h) for h in layout}) == 1
        for nics in (1, 2):
            hosts = Hosts(layout, nics=nics)
            mates = [r for r in range(n) if hosts.nic(r) == hosts.nic(0)]
            for algo, fast in (("ring", _ring_crowd), ("rail", _rail_crowd)) if equal else (("ring", _ring_crowd),):
                for coll in ("all_reduce", "reduce_scatter", "all_gather"):
                    for count, chunk in ((1, 64), (n - 1, 64), (5 * n + 3, 4), (1000, 16)):
                        scheds = [plan(coll, count, r, n, 0, chunk, algo, layout=layout if algo == "rail" else ())
                                  for r in mates]
                        assert fast(coll, count, n, chunk, hosts) == _crowd(scheds, mates, layout), \
                            (layout, nics, algo, coll, count, chunk)


def test_leader_phases_back_to_back_bound_the_simulation():
    """Beyond 16 ranks ``leader`` is priced as its phases in sequence: never below the event simulation,
    and within 2x of it (checked where both run: 4 hosts x 4; the phases overlap a little in reality)."""
    layout = tuple(r // 4 for r in range(16))
    hosts, link = Hosts(layout), LINKS["100g"]
    for coll in ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter"):
        for size in (8, 64 << 10, 16 << 20):
            count = max(1, size // 4 // (16 if coll in ("all_gather", "reduce_scatter") else 1))
            exact = simulate([plan(coll, count, r, 16, 0, CHUNK, "leader", layout=layout) for r in range(16)],
                             link, 4, hosts)
            bound = leader_time(coll, count, link, 4, CHUNK, hosts)
            assert exact * 0.999 <= bound <= exact * 2, (coll, size, exact, bound)


def test_two_links_price_a_flat_ring_at_its_slowest_hop():
    """A flat ring over 2 hosts x 2 ranks waits for the network hop every step: slower than on shared memory
    alone, no faster than on the network alone, and lockstep (used beyond 16 ranks) does not price it lower."""
    layout, link = (0, 0, 1, 1), LINKS["tcp"]
    count = 1 << 20
    scheds = [plan("all_reduce", count, r, 4, 0, CHUNK, "ring") for r in range(4)]
    exact = simulate(scheds, link, 4, Hosts(layout))
    assert lockstep(scheds[1], link, 4, 1, Hosts(layout)) >= exact
    assert simulate(scheds, LINKS["same-host"], 4) < exact <= simulate(scheds, link, 4) * 1.001


def test_sim_cli_with_hosts():
    p = subprocess.run([sys.executable, "-m", "aioccl.tools.sim", "all_reduce", "--link", "100g", "--per-host", "8",
                        "--ranks", "16,4096", "--sizes", "8,64M"], capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr
    assert "hosts of 8 ranks" in p.stdout and "rail time(us)" in p.stdout and "leader time(us)" in p.stdout
    lines = [ln for ln in p.stdout.splitlines() if not ln.startswith("#")]
    assert len(lines) == 4 and all(ln.count("*") == 1 for ln in lines)


def test_ranks_of_a_host_share_its_nic():
    """Rail crosses the network from every rank of a host at once: with one NIC they divide it, with one NIC
    per rank they do not; a flat ring crosses from one rank per host either way."""
    layout = tuple(r // 8 for r in range(64))
    one, eight = Hosts(layout), Hosts(layout, nics=8)
    rail = {h.nics: predict("all_reduce", "rail", 1 << 24, 64, LINKS["100g"], 4, CHUNK, h) for h in (one, eight)}
    ring = {h.nics: predict("all_reduce", "ring", 1 << 24, 64, LINKS["100g"], 4, CHUNK, h) for h in (one, eight)}
    assert rail[1] > 1.2 * rail[8]
    assert ring[1] == pytest.approx(ring[8], rel=1e-9)
    small = [Hosts((0, 0, 1, 1)), Hosts((0, 0, 1, 1), nics=2)]  # the event simulation shares ports the same way
    t = [simulate([plan("all_reduce", 1 << 20, r, 4, 0, CHUNK, "rail", layout=(0, 0, 1, 1)) for r in range(4)],
                  LINKS["tcp"], 4, h) for h in small]
    assert t[0] > 1.1 * t[1]


def test_streams_lift_a_link_faster_than_one_stream_until_the_nic_caps_it():
    """``--streams``: one TCP stream's copies move about one core's worth; a 100 Gb/s NIC needs four,
    a 25 Gb/s one is already its own limit with one."""
    from aioccl.algorithms.cost import STREAM_RATE, with_streams

    count = (64 << 20) // 4
    t = {k: predict("all_reduce", "ring", count, 2, with_streams(LINKS["100g"], k), 4, 1 << 20) for k in (1, 2, 4, 8)}
    assert t[1] > 1.6 * t[2] > 1.6 * 1.3 * t[4]  # each doubling helps while the streams are the limit
    assert t[8] == pytest.approx(t[4])  # four streams (13.6 GB/s) already pass the NIC (12.5 GB/s)
    assert with_streams(LINKS["100g"], 8).beta == LINKS["100g"].beta
    assert with_streams(LINKS["25g"], 1).beta == LINKS["25g"].beta  # 3.125 GB/s < one stream's 3.4
    assert with_streams(LINKS["100g"], 1).beta == pytest.approx(1 / STREAM_RATE)
    out = subprocess.run([sys.executable, "-m", "aioccl.tools.sim", "all_reduce", "--link", "100g", "--ranks", "2",
                          "--sizes", "64M", "--streams", "4"], capture_output=True, text=True, check=True).stdout
    assert "'100g x4'" in out
