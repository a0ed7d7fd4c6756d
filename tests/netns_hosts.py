"""Hosts on one machine for tests: network namespaces on a bridge, and what a bad network does to them.

Each host is a namespace with a veth to a bridge (in a namespace of its own). The kernel here has no
``netem``; loss is a classic-BPF filter on ``clsact`` (``ld rand``: a packet matches with probability p)
whose action redirects the packet into a veth that is down, so it is dropped; ``tc tbf`` caps a rate;
``ip link set DEV down`` cuts a link. Needs root and iproute2; ``can_netns()`` says why not otherwise.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def can_netns() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "needs iproute2 ('ip')"
    probe = f"aioprobe{os.getpid() % 100000}"
    try:
        sh("ip", "netns", "add", probe)
        sh("ip", "netns", "del", probe)
    except (subprocess.CalledProcessError, OSError) as e:
        return f"cannot create network namespaces here: {e}"
    return None


def _loss_program(p: float) -> str:
    """cBPF for cls_bpf: A = random u32; match (return -1) when A < p * 2**32, else no match (return 0)."""
    threshold = int(p * (1 << 32))
    return f"4,32 0 0 {(1 << 32) - 4096 + 56},53 1 0 {threshold},6 0 0 {(1 << 32) - 1},6 0 0 0"


class Hosts:
    """``n`` namespace hosts on one bridge, addresses 10.217.<tag>.<i+1>."""

    def __init__(self, n: int) -> None:
        tag = os.getpid() % 1000
        self.tag = tag
        self.ns = [f"aion{tag}h{i}" for i in range(n)]
        self.bridge = f"aion{tag}br"
        self.dev = [f"en{tag}h{i}" for i in range(n)]  # the host's side
        self.port = [f"pn{tag}h{i}" for i in range(n)]  # the bridge's side
        self.subnet = f"10.217.{tag % 250}"
        self.addrs = [f"{self.subnet}.{i + 1}" for i in range(n)]
        try:
            sh("ip", "netns", "add", self.bridge)
            sh("ip", "-n", self.bridge, "link", "add", "br0", "type", "bridge")
            sh("ip", "-n", self.bridge, "link", "set", "br0", "up")
            for i, name in enumerate(self.ns):
                sh("ip", "netns", "add", name)
                sh("ip", "-n", name, "link", "set", "lo", "up")
                sh("ip", "link", "add", self.dev[i], "netns", name, "type", "veth", "peer", "name", self.port[i],
                   "netns", self.bridge)
                sh("ip", "-n", self.bridge, "link", "set", self.port[i], "master", "br0")
                sh("ip", "-n", self.bridge, "link", "set", self.port[i], "up")
                sh("ip", "-n", name, "addr", "add", f"{self.addrs[i]}/24", "dev", self.dev[i])
                sh("ip", "-n", name, "link", "set", self.dev[i], "up")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for name in [*self.ns, self.bridge]:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)

    def _lossy(self, netns: str, dev: str, p: float) -> None:
        hole = f"bh{dev[2:]}"[:15]
        sh("ip", "-n", netns, "link", "add", hole, "type", "veth", "peer", "name", hole + "z")  # stays down
        sh("ip", "netns", "exec", netns, "tc", "qdisc", "add", "dev", dev, "clsact")
        sh("ip", "netns", "exec", netns, "tc", "filter", "add", "dev", dev, "egress", "protocol", "all", "bpf",
           "bytecode", _loss_program(p), "action", "mirred", "egress", "redirect", "dev", hole)

    def loss(self, p: float) -> None:
        """Drop each packet with probability ``p``, each way: leaving every host and leaving the bridge."""
        for name, dev, port in zip(self.ns, self.dev, self.port, strict=True):
            self._lossy(name, dev, p)
            self._lossy(self.bridge, port, p)

    def dropped(self) -> int:
        """Packets the loss filters took, over every host's link and both ways."""
        total = 0
        for netns, dev in [*zip(self.ns, self.dev, strict=True), *((self.bridge, p) for p in self.port)]:
            out = subprocess.run(["ip", "netns", "exec", netns, "tc", "-s", "filter", "show", "dev", dev, "egress"],
                                 capture_output=True, text=True).stdout
            total += sum(int(m) for m in re.findall(r"Sent \d+ bytes (\d+) pkt", out))
        return total

    def link(self, i: int, up: bool) -> None:
        sh("ip", "-n", self.ns[i], "link", "set", self.dev[i], "up" if up else "down")

    def run(self, i: int, per_host: int, script: Path, port: int, secret: str, env: dict[str, str],
            *args: str) -> subprocess.Popen[str]:
        """``aioccl-run`` on host ``i`` (node rank i of ``len(ns)``), its output piped."""
        cmd = ["ip", "netns", "exec", self.ns[i], sys.executable, "-m", "aioccl.run", "--nnodes", str(len(self.ns)),
               "--node-rank", str(i), "--master-addr", self.addrs[0], "--master-port", str(port),
               "--nproc-per-node", str(per_host), "--secret", secret, str(script), *args]
        return subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(ROOT), **env}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
