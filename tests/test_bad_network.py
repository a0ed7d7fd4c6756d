"""Jobs on namespace hosts that survive a bad network: packet loss, a flapping link, a cut link, a late host.

Each test builds hosts from network namespaces on a bridge (``netns_hosts.py``), runs aioccl-run on each,
and checks exact results in every rank's ``RESULT`` line. Skipped without root or iproute2.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

import pytest
from netns_hosts import Hosts, can_netns

from conftest import WORKERS

WORKER = WORKERS / "bad_network.py"


@pytest.fixture
def hosts3():
    reason = can_netns()
    if reason:
        pytest.skip(reason)
    h = Hosts(3)
    try:
        yield h
    finally:
        h.close()


def _results(procs, timeout: float) -> list[dict]:
    outs = [p.communicate(timeout=timeout) for p in procs]
    text = "".join(o + e for o, e in outs)
    res = [json.loads(line.split("RESULT ", 1)[1]) for o, _ in outs for line in o.splitlines() if "RESULT " in line]
    for p in procs:
        assert p.returncode == 0, text[-4000:]
    return res


def _start(h: Hosts, per_host: int, mode: str, env: dict[str, str], port: int, delay: dict[int, float] | None = None):
    secret = secrets.token_hex(16)
    procs = []
    for i in range(len(h.ns)):
        if delay and i in delay:
            time.sleep(delay[i])
        procs.append(h.run(i, per_host, WORKER, port, secret, {**env, "TEST_HOST": f"host {i}"}, mode))
    return procs


@pytest.mark.parametrize("streams", [1, 3])
def test_one_percent_loss_each_way_500_mixed_collectives(hosts3, streams):
    """3 hosts x 2 ranks (shared memory inside, hierarchical and flat schedules across), 1% of packets dropped
    leaving every host and leaving the bridge: 500 collectives of every kind, all exact, none past its
    deadline, and the filters really dropped packets. With 3 TCP streams per pair across hosts, one op in
    nine is instead a 3 MiB point-to-point message to the next host, striped over the three."""
    hosts3.loss(0.01)
    env = {"TEST_OP_TIMEOUT": "30", "AIOCCL_NSOCKS": str(streams), "TEST_BIG_P2P": "1" if streams > 1 else "0"}
    res = _results(_start(hosts3, 2, "mixed", env, 29641 + streams), timeout=420)
    print(res, f"{hosts3.dropped()} packets dropped")
    assert len(res) == 6
    for r in res:
        assert r["ops"] == 500 and r["wrong"] == [], r
        assert r["slowest_s"] < 30, r
    assert hosts3.dropped() > 20, "the loss filters dropped nothing: the test did not test loss"


def _loop_until(h: Hosts, tmp: Path, n: int, procs) -> None:
    deadline = time.monotonic() + 120
    while len(list(tmp.glob("looping-*"))) < n:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            for p in procs:
                p.kill()
            pytest.fail("ranks did not come up:\n" + "\n".join(o + e for o, e in (p.communicate() for p in procs)))
        time.sleep(0.05)
    time.sleep(0.3)


def _progress(tmp: Path, n: int, more: int, procs) -> None:
    """Wait until each of the n ranks has finished ``more`` ops since now (the worker's ops-<rank> files):
    after a flap, TCP resends on its backed-off timer (a second or more), so a fixed wait saw 9 ops or 12."""
    def counts() -> list[int]:
        return [int((tmp / f"ops-{r}").read_text() or 0) if (tmp / f"ops-{r}").exists() else 0 for r in range(n)]

    start, deadline = counts(), time.monotonic() + 60
    while any(c < s + more for c, s in zip(counts(), start, strict=True)):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            pytest.fail(f"the ranks did not get {more} ops further in 60 s after the link came back: {counts()}")
        time.sleep(0.05)


def test_a_link_that_flaps_for_2s_within_the_deadline(hosts3, tmp_path):
    """Host 2's link goes down for 2 s while all_reduces run (deadline 10 s, the default peer timeout):
    the op in flight waits it out, nothing fails, every result is exact."""
    env = {"TEST_DIR": str(tmp_path), "TEST_OP_TIMEOUT": "10"}
    procs = _start(hosts3, 1, "loop", env, 29643)
    try:
        _loop_until(hosts3, tmp_path, 3, procs)
        _progress(tmp_path, 3, 5, procs)  # (ops > 10 below: 5 before the flap, 6 after it, the one across it)
        hosts3.link(2, up=False)
        time.sleep(2.0)
        hosts3.link(2, up=True)
        _progress(tmp_path, 3, 6, procs)  # ops flow again (once TCP's retransmission timer has fired)
        (tmp_path / "stop").touch()
        res = _results(procs, timeout=60)
    finally:
        for p in procs:
            p.kill()
    print(res)
    assert len(res) == 3
    for r in res:
        assert "failed" not in r and r["wrong"] == 0 and r["ops"] > 10, r
        assert 1.5 < r["slowest_s"] < 10, r  # one op spanned the flap and completed


def test_a_link_cut_for_good_names_the_unreachable_host_and_the_others_shrink(hosts3, tmp_path):
    """Host 2's link goes down for good (2 ranks per host, default peer timeout, op deadline 4 s): every
    rank raises PeerLost or CollectiveTimeout within its deadline + 2 s; the survivors' errors name a rank of
    host 2, and shrink() leaves hosts 0 and 1 with a working communicator."""
    env = {"TEST_DIR": str(tmp_path), "TEST_OP_TIMEOUT": "4"}
    procs = _start(hosts3, 2, "loop", env, 29645)
    try:
        _loop_until(hosts3, tmp_path, 6, procs)
        cut = time.time()
        hosts3.link(2, up=False)
        res = _results(procs, timeout=90)
    finally:
        for p in procs:
            p.kill()
    print(json.dumps(res, indent=1))
    assert len(res) == 6
    for r in res:
        assert r["failed"] in ("PeerLost", "CollectiveTimeout") and r["wrong"] == 0, r
        assert r["at"] - cut < 4 + 2, f"rank {r['rank']}: {r['at'] - cut:.2f}s after the cut"
    for r in (r for r in res if r["rank"] < 4):
        assert set(r["named"]) & {4, 5}, r  # the unreachable host's ranks
        assert r["shrunk"] == {"size": 4, "sum": 10}, r  # ranks 0-3 renumbered 0-3: 1+2+3+4


def test_a_host_that_comes_up_10s_late_joins(hosts3, tmp_path):
    """Host 2 starts 10 s after the others: init waits for it, then 500 collectives run exact."""
    env = {"TEST_DIR": str(tmp_path), "TEST_INIT_TIMEOUT": "60"}
    t0 = time.monotonic()
    res = _results(_start(hosts3, 1, "mixed", env, 29647, delay={2: 10.0}), timeout=240)
    assert time.monotonic() - t0 > 10
    assert len(res) == 3 and all(r["wrong"] == [] for r in res), res


def test_a_host_that_never_comes_names_what_is_missing(hosts3, tmp_path):
    """Host 2 never starts: the others' init fails within its timeout with a clear error naming the ranks
    that did not arrive and the node they were to start on."""
    env = {"TEST_DIR": str(tmp_path), "TEST_INIT_TIMEOUT": "6"}
    secret = secrets.token_hex(16)
    t0 = time.monotonic()
    procs = [hosts3.run(i, 1, WORKER, 29649, secret, env, "mixed") for i in range(2)]
    outs = [p.communicate(timeout=60) for p in procs]
    took = time.monotonic() - t0
    text = "".join(o + e for o, e in outs)
    print(text[-3000:])
    assert all(p.returncode != 0 for p in procs)
    assert took < 6 + 10, took
    want = "ranks [2] of 3 (node 2 of aioccl-run's, 1 per node) did not reach the root within 6s"
    assert "BootstrapError" in text and want in text, text[-3000:]
