"""Two hosts on one machine: network namespaces joined by a veth pair, aioccl-run on each.

Needs root and iproute2; skipped with the reason otherwise. Traffic stays
inside the namespaces this test creates (addresses 10.213.x.1/.2 on the veth
pair exist nowhere else).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, WORKERS


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def _can_netns() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "needs iproute2 ('ip')"
    probe = f"aioprobe{os.getpid() % 100000}"
    try:
        _sh("ip", "netns", "add", probe)
        _sh("ip", "netns", "del", probe)
    except (subprocess.CalledProcessError, OSError) as e:
        return f"cannot create network namespaces here: {e}"
    return None


@pytest.fixture
def two_hosts():
    reason = _can_netns()
    if reason:
        pytest.skip(reason)
    tag = os.getpid() % 10000
    ns = [f"aioh{tag}a", f"aioh{tag}b"]
    dev = [f"aio{tag}a", f"aio{tag}b"]
    subnet = f"10.213.{tag % 250}"
    addrs = [f"{subnet}.1", f"{subnet}.2"]
    try:
        for n in ns:
            _sh("ip", "netns", "add", n)
        _sh("ip", "link", "add", dev[0], "netns", ns[0], "type", "veth", "peer", "name", dev[1], "netns", ns[1])
        for n, d, a in zip(ns, dev, addrs, strict=True):
            _sh("ip", "-n", n, "addr", "add", f"{a}/24", "dev", d)
            _sh("ip", "-n", n, "link", "set", d, "up")
            _sh("ip", "-n", n, "link", "set", "lo", "up")
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
