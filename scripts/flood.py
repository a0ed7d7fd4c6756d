"""Flood aioccl's listening sockets with junk, as fast as this machine allows, for a bounded time.

    python scripts/flood.py --pids 1234 1235 --target all --seconds 20
    python scripts/flood.py --port 29501 --seconds 20

What a hostile or broken neighbour on a shared machine sends: random bytes,
8-byte huge length prefixes (the connection then kept open, at most
``--prefix-held`` at once), connections that connect and stay silent (at most
``--holders`` held at once), connections opened and closed at once, and
datagrams at aioccl's doorbells, from ``--procs`` processes of ``--threads``
threads each. Targets: ``--port`` (fixed TCP ports),
``--port-dir`` (the newest ``*.port`` file in it, re-read as they appear: a
root started later), and with ``--pids`` whatever those processes listen on, found
in /proc again every 0.2 s: their TCP listeners (the root, the bootstrap
acceptors) and their ``@aioccl-bell-*`` datagram sockets. ``--target`` picks
which: ``root`` (the port files and ``--port``), ``acceptors`` (the pids' TCP
listeners but those), ``bells``, or ``all``.

Prints ``FLOOD DONE`` and the counts per mode at the end (or on SIGTERM).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import struct
import threading
import time
from collections import Counter
from pathlib import Path

MODES = ("random", "prefix", "churn", "holder")


class Targets:
    """The ports and doorbells to hit, refreshed from /proc and the port files by one thread."""

    def __init__(self, ns: argparse.Namespace) -> None:
        self.ns = ns
        self.tcp: list[int] = list(ns.port)
        self.bells: list[bytes] = []
        self.lock = threading.Lock()

    def refresh(self) -> None:
        fixed = set(self.ns.port)
        if self.ns.port_dir:
            files = sorted(Path(self.ns.port_dir).glob("*.port"), key=lambda f: f.stat().st_mtime)
            try:
                fixed |= {int(files[-1].read_text().strip() or 0)} if files else set()
            except (OSError, ValueError):
                pass
        fixed.discard(0)
        listeners, bells = _listening(self.ns.pids) if self.ns.pids else (set(), set())
        tcp: set[int] = set()
        if self.ns.target in ("root", "all"):
            tcp |= fixed
        if self.ns.target in ("acceptors", "all"):
            tcp |= listeners - fixed
        with self.lock:
            self.tcp = sorted(tcp)
            self.bells = sorted(bells) if self.ns.target in ("bells", "all") else []

    def pick(self, rng: random.Random) -> tuple[list[int], list[bytes]]:
        with self.lock:
            return self.tcp, self.bells


def _inodes(pids: list[int]) -> set[int]:
    out: set[int] = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:["):
                    out.add(int(link[8:-1]))
        except OSError:
            pass
    return out


def _listening(pids: list[int]) -> tuple[set[int], set[bytes]]:
    inodes = _inodes(pids)
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[9]) in inodes:  # 0A: LISTEN
                ports.add(int(f[1].rsplit(":", 1)[1], 16))
    bells: set[bytes] = set()
    try:
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
            f = line.split()
            if len(f) >= 8 and f[7].startswith("@aioccl-bell-") and int(f[6]) in inodes:
                bells.add(b"\0" + f[7][1:].encode())
    except OSError:
        pass
    return ports, bells


def _keep(s: socket.socket, pool: list[socket.socket], limit: int, lock: threading.Lock) -> bool:
    """Keep ``s`` open in ``pool`` (closing the oldest beyond ``limit``); False when nothing is kept."""
    if limit <= 0:
        return False
    with lock:
        pool.append(s)
        while len(pool) > limit:
            pool.pop(0).close()
    return True


def spray(targets: Targets, stop: threading.Event, counts: Counter[str], seed: int, ns: argparse.Namespace,
          pools: dict[str, list[socket.socket]], lock: threading.Lock) -> None:
    rng = random.Random(seed)
    dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dgram.setblocking(False)
    while not stop.is_set():
        tcp, bells = targets.pick(rng)
        if bells and (not tcp or rng.random() < 0.3):
            for _ in range(64):
                try:
                    dgram.sendto(rng.randbytes(rng.randint(1, 64)), rng.choice(bells))
                    counts["datagram"] += 1
                except OSError:
                    counts["datagram refused"] += 1
                    break
            continue
        if not tcp:
            time.sleep(0.005)
            continue
        mode = rng.choice(MODES)
        s = socket.socket()
        s.settimeout(1.0)
        try:
            s.connect(("127.0.0.1", rng.choice(tcp)))
            counts[mode] += 1
            if mode == "random":
                s.sendall(rng.randbytes(rng.randint(1, 200)))
            elif mode == "prefix":
                s.sendall(struct.pack("<Q", rng.choice((2**63 - 1, 2**32 - 16, 2**40))))
                if _keep(s, pools["prefix"], ns.prefix_held, lock):
                    s = None  # type: ignore[assignment]
            elif mode == "holder" and _keep(s, pools["holder"], ns.holders, lock):
                s = None  # type: ignore[assignment]
        except OSError:
            counts[f"{mode} failed"] += 1
        finally:
            if s is not None:
                s.close()
    dgram.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, nargs="*", default=[])
    p.add_argument("--port-dir", default=None)
    p.add_argument("--pids", type=int, nargs="*", default=[])
    p.add_argument("--target", choices=("root", "acceptors", "bells", "all"), default="all")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--holders", type=int, default=20, help="silent connections held at once, at most")
    p.add_argument("--prefix-held", type=int, default=200, help="length-prefix connections kept open, at most")
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    ns = p.parse_args()
    children = []
    for i in range(1, ns.procs):
        pid = os.fork()
        if pid == 0:
            ns.seed += 1000 * i
            children = []
            break
        children.append(pid)
    targets, stop, counts = Targets(ns), threading.Event(), Counter[str]()
    pools: dict[str, list[socket.socket]] = {"holder": [], "prefix": []}
    lock = threading.Lock()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    workers = [threading.Thread(target=spray, args=(targets, stop, counts, ns.seed + i, ns, pools, lock),
                                daemon=True) for i in range(ns.threads)]
    targets.refresh()
    for w in workers:
        w.start()
    end = time.monotonic() + ns.seconds
    while not stop.is_set() and time.monotonic() < end:
        stop.wait(0.2)
        targets.refresh()
    stop.set()
    for w in workers:
        w.join(5)
    for pool in pools.values():
        for s in pool:
            s.close()
    line = " ".join(f"{k.replace(' ', '_')}={v}" for k, v in sorted(counts.items()))
    if not children and ns.procs > 1:  # a forked sprayer: its counts go to the first one through a pipe-free exit
        print(f"FLOOD PART {line}", flush=True)
        os._exit(0)
    for pid in children:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
    print("FLOOD DONE " + line, flush=True)


if __name__ == "__main__":
    main()
