"""Two hosts on one machine: network namespaces joined by a veth pair, aioccl-run on each.

Needs root and iproute2; skipped with the reason otherwise. Traffic stays
inside the namespaces this test creates (addresses 10.213.x.1/.2 on the veth
pair exist nowhere else).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time

import pytest
from netns_hosts import can_netns, sh

from conftest import ROOT, WORKERS


@pytest.fixture
def two_hosts():
    reason = can_netns()
    if reason:
        pytest.skip(reason)
    tag = os.getpid() % 10000
    ns = [f"aioh{tag}a", f"aioh{tag}b"]
    dev = [f"aio{tag}a", f"aio{tag}b"]
    subnet = f"10.213.{tag % 250}"
    addrs = [f"{subnet}.1", f"{subnet}.2"]
    try:
        for n in ns:
            sh("ip", "netns", "add", n)
        sh("ip", "link", "add", dev[0], "netns", ns[0], "type", "veth", "peer", "name", dev[1], "netns", ns[1])
        for n, d, a in zip(ns, dev, addrs, strict=True):
            sh("ip", "-n", n, "addr", "add", f"{a}/24", "dev", d)
            sh("ip", "-n", n, "link", "set", d, "up")
            sh("ip", "-n", n, "link", "set", "lo", "up")
        yield ns, dev, addrs
    finally:
        for n in ns:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)


def test_two_hosts_two_ranks_each(two_hosts):
    ns, dev, addrs = two_hosts
    secret = secrets.token_hex(16)
    procs = []
    for node in range(2):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "AIOCCL_NODE": str(node)}
        if node == 1:
            env["AIOCCL_SOCKET_IFNAME"] = dev[1][:-1]  # a prefix, NCCL-style; node 0 uses the route to the root
        cmd = ["ip", "netns", "exec", ns[node], sys.executable, "-m", "aioccl.run", "--nnodes", "2",
               "--node-rank", str(node), "--master-addr", addrs[0], "--master-port", "29611",
               "--nproc-per-node", "2", "--secret", secret, str(WORKERS / "multihost.py")]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=180) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-2000:] + err[-2000:]
    text = outs[0][0] + outs[1][0]
    print(text)
    assert text.count(", 0 failures") == 4, text


def test_topology_across_two_hosts(two_hosts):
    """``aioccl-info --topology`` under aioccl-run on two namespace hosts prints the hosts and every pair's
    transport; ``AIOCCL_DEBUG=INFO`` logs each rank's topology line."""
    ns, dev, addrs = two_hosts
    secret = secrets.token_hex(16)
    procs = []
    for node in range(2):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "AIOCCL_DEBUG": "INFO", "AIOCCL_DEBUG_SUBSYS": "COLL"}
        cmd = ["ip", "netns", "exec", ns[node], sys.executable, "-m", "aioccl.run", "--nnodes", "2",
               "--node-rank", str(node), "--master-addr", addrs[0], "--master-port", "29613",
               "--nproc-per-node", "2", "--secret", secret, "-m", "aioccl.tools.info", "--topology"]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-2000:] + err[-2000:]
    text = "".join(o + e for o, e in outs)
    print(text)
    assert "topology 2 host(s), ranks per host 2x2" in outs[0][0]
    assert "hierarchical where the tuner finds it faster (rail, leader)" in outs[0][0]
    for row in ("0 self  shm  tcp  tcp", "1  shm self  tcp  tcp", "2  tcp  tcp self  shm", "3  tcp  tcp  shm self"):
        assert row in outs[0][0], outs[0][0]
    for r in range(4):
        assert f"rank {r}: topology 2 host(s), ranks per host 2x2" in text
    assert "my pairs: shm 1, tcp 2" in text


@pytest.fixture
def three_hosts(tmp_path):
    """Three namespaces on a bridge (in a fourth), each with a decoy interface (a veth pair inside it, as this
    kernel may lack the dummy module) that must not be chosen."""
    reason = can_netns()
    if reason:
        pytest.skip(reason)
    tag = os.getpid() % 1000
    ns = [f"aio3h{tag}{i}" for i in range(3)]
    bridge_ns = f"aio3b{tag}"
    dev = [f"e{tag}h{i}" for i in range(3)]
    subnet = f"10.214.{tag % 250}"
    addrs = [f"{subnet}.{i + 1}" for i in range(3)]
    try:
        sh("ip", "netns", "add", bridge_ns)
        sh("ip", "-n", bridge_ns, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", bridge_ns, "link", "set", "br0", "up")
        for i, n in enumerate(ns):
            sh("ip", "netns", "add", n)
            sh("ip", "-n", n, "link", "set", "lo", "up")
            decoy = f"dm{tag}h{i}"  # created first: a naive "first interface" choice would take it
            sh("ip", "-n", n, "link", "add", decoy, "type", "veth", "peer", "name", f"dz{tag}h{i}")  # no dummy module
            sh("ip", "-n", n, "addr", "add", f"10.215.{tag % 250}.{i + 1}/24", "dev", decoy)
            sh("ip", "-n", n, "link", "set", decoy, "up")
            sh("ip", "link", "add", dev[i], "netns", n, "type", "veth", "peer", "name", f"b{tag}h{i}",
                "netns", bridge_ns)
            sh("ip", "-n", bridge_ns, "link", "set", f"b{tag}h{i}", "master", "br0")
            sh("ip", "-n", bridge_ns, "link", "set", f"b{tag}h{i}", "up")
            sh("ip", "-n", n, "addr", "add", f"{addrs[i]}/24", "dev", dev[i])
            sh("ip", "-n", n, "link", "set", dev[i], "up")
        yield ns, dev, addrs, subnet
    finally:
        for n in [*ns, bridge_ns]:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)


def test_three_hosts_interface_choice_and_a_cut_link(three_hosts, tmp_path):
    """aioccl-run --nnodes 3; AIOCCL_SOCKET_IFNAME unset / exclude / exact; then host 2's link goes down
    mid-collective: every rank fails with PeerLost or CollectiveTimeout within the deadline."""
    ns, dev, addrs, subnet = three_hosts
    secret = secrets.token_hex(16)
    ifnames = [None, "^dm,lo", f"={dev[2]}"]  # automatic (route to the root), exclude, exact
    procs = []
    for node in range(3):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TEST_SUBNET": subnet, "TEST_HOST": f"host {node}",
               "TEST_DIR": str(tmp_path), "AIOCCL_PEER_TIMEOUT": "2"}
        env.pop("AIOCCL_SOCKET_IFNAME", None)
        if ifnames[node]:
            env["AIOCCL_SOCKET_IFNAME"] = ifnames[node]
        cmd = ["ip", "netns", "exec", ns[node], sys.executable, "-m", "aioccl.run", "--nnodes", "3",
               "--node-rank", str(node), "--master-addr", addrs[0], "--master-port", "29612",
               "--nproc-per-node", "1", "--secret", secret, str(WORKERS / "three_hosts.py")]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("looping-*"))) < 3:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                for p in procs:
                    p.kill()
                pytest.fail("ranks did not come up:\n" + "\n".join(o + e for o, e in (p.communicate() for p in procs)))
            time.sleep(0.05)
        time.sleep(0.3)  # well inside the loop of all_reduces
        cut = time.time()
        sh("ip", "-n", ns[2], "link", "set", dev[2], "down")
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            p.kill()
    text = "".join(o for o, _ in outs)
    print(text)
    assert text.count(", 0 failures") == 3, text + "".join(e for _, e in outs)
    failed = [ln for ln in text.splitlines() if "FAILED-AS-DATA" in ln]
    assert len(failed) == 3, text
    for ln in failed:
        when = float(ln.split(" at ")[1].split()[0])
        assert "PeerLost" in ln or "CollectiveTimeout" in ln
        print(f"{when - cut:.2f}s after the cut: {ln}")
        assert when - cut < 4.0 + 1.5, f"{ln}: {when - cut:.2f}s after the cut"  # op deadline 4 s, with slack
    for p in procs:
        assert p.returncode == 0
