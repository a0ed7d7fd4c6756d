"""Real ranks bootstrap and compute exactly while scripts/flood.py floods each listening socket in turn.

    python scripts/flood_check.py --ranks 3 --ops 200 --seconds-per-phase 0   # one run; exit 0 = passed

Phases, each with its own sprayer (``flood.py``, as fast as it can):

0. the world's root: ranks started by hand (``RANK``, ``WORLD_SIZE``,
   ``MASTER_ADDR``, ``MASTER_PORT``, no secret) bootstrap while its port is
   flooded;
1. (no flood) a warm-up round; then each rank records its open fds and RSS;
2. rounds under a flood of, in turn, the round's root, the ranks' bootstrap
   acceptors, the doorbells (``--transport tcp``: no shared memory and 3 TCP
   streams per pair, so the acceptors admit every pair's stripe sockets too; no
   doorbells). Each round, rank 0 starts a root
   (``UniqueId.new``), the ranks form a communicator through it (the last
   rank comes ``--late`` s after the others, so acceptors and root are open
   under the flood), run ``--ops`` all_reduces and all_gathers checked
   element by element, and close it;
3. (the flood stopped) each rank records its fds and RSS again: they must be
   what they were before the flood (fds equal; RSS within ``--rss-slack-mib``).
   Meanwhile a thread sampled both every 10 ms: the peaks show the bound held
   the whole time (at most the root's and an acceptor's handshake queues more fds).

Prints one JSON line per rank and ``FLOOD CHECK PASSED`` or the reason it failed.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLOOD = ROOT / "scripts" / "flood.py"
TARGETS = {"shm": ("root", "acceptors", "bells"), "tcp": ("root", "acceptors")}
TRANSPORT_ENV = {"shm": {}, "tcp": {"AIOCCL_SHM_DISABLE": "1", "AIOCCL_NSOCKS": "3"}}


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def _wait_file(path: Path, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > end:
            raise TimeoutError(f"no {path.name} within {timeout:g}s")
        await asyncio.sleep(0.02)


async def _round(world: object, rank: int, size: int, i: int, ns: argparse.Namespace, d: Path) -> int:
    """One communicator formed through a new root, used, closed; returns the elements checked."""
    import numpy as np

    import aioccl

    comm1: aioccl.Communicator = world  # type: ignore[assignment]
    text = np.zeros(64, np.uint8)
    if rank == 0:
        uid = aioccl.UniqueId.new(host="127.0.0.1")
        (d / f"round{i}.port").write_text(str(uid.port))
        text[:len(str(uid).encode())] = np.frombuffer(str(uid).encode(), np.uint8)
    await comm1.broadcast(text, root=0)
    uid = aioccl.UniqueId.parse(bytes(text).rstrip(b"\0").decode())
    if rank == size - 1 and i > 0:
        await asyncio.sleep(ns.late)
    comm = await aioccl.Communicator.create(uid, rank, size, timeout=120)
    checked = 0
    try:
        for k in range(ns.ops):
            n = (1, 7, 1000, 20000)[k % 4]
            base = np.arange(n, dtype=np.int64) % 13
            x = base + rank
            out = np.full(n, -999, np.int64)
            await comm.all_reduce(x, out=out)
            want = base * size + size * (size - 1) // 2
            if not np.array_equal(out, want):
                raise AssertionError(f"round {i} op {k}: all_reduce of {n} wrong at "
                                     f"{np.flatnonzero(out != want)[:5]}")
            gathered = np.full(n * size, -999, np.int64)
            await comm.all_gather(x, out=gathered)
            want_g = np.concatenate([base + r for r in range(size)])
            if not np.array_equal(gathered, want_g):
                raise AssertionError(f"round {i} op {k}: all_gather of {n} wrong")
            checked += 2 * n + n * size
    finally:
        await comm.close()
    return checked


async def worker(ns: argparse.Namespace) -> None:
    import aioccl

    d = Path(ns.dir)
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    world = await aioccl.init(timeout=120)
    (d / f"world.{rank}").write_text("")
    checked = await _round(world, rank, size, 0, ns, d)
    await asyncio.sleep(0.3)  # the warm-up round's root thread has let go of its sockets
    gc.collect()
    fds0, rss0 = _fds(), _rss_kib()
    peaks, sampling = [fds0, rss0], threading.Event()

    def sample() -> None:
        while not sampling.wait(0.01):
            try:
                peaks[0], peaks[1] = max(peaks[0], _fds()), max(peaks[1], _rss_kib())
            except OSError:
                pass

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    for i, _ in enumerate(TARGETS[ns.transport], start=1):
        await _wait_file(d / f"go{i}")
        checked += await _round(world, rank, size, i, ns, d)
        (d / f"done{i}.{rank}").write_text("")
    await _wait_file(d / "stopped")
    sampling.set()
    sampler.join()
    await asyncio.sleep(0.3)
    gc.collect()
    fds1, rss1 = _fds(), _rss_kib()
    await world.close()
    print(json.dumps({"rank": rank, "checked": checked, "fds_before": fds0, "fds_peak": peaks[0], "fds_after": fds1,
                      "rss_before_kib": rss0, "rss_peak_kib": peaks[1], "rss_after_kib": rss1}), flush=True)


def _sprayer(args: list[str], seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(FLOOD), "--seconds", str(seconds), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _stop(sprayer: subprocess.Popen[str], what: str, report: list[str]) -> None:
    sprayer.terminate()
    out, _ = sprayer.communicate(timeout=30)
    lines = [x for x in out.splitlines() if x.startswith(("FLOOD DONE", "FLOOD PART"))] or [out[-300:]]
    report.append(f"{what}: " + " | ".join(lines))


def _wait_all(d: Path, pattern: str, n: int, procs: list[subprocess.Popen[str]], timeout: float) -> None:
    end = time.monotonic() + timeout
    while len(list(d.glob(pattern))) < n:
        if any(p.poll() is not None for p in procs):
            raise SystemExit(f"FLOOD CHECK FAILED: a rank exited early (waiting for {pattern})")
        if time.monotonic() > end:
            raise SystemExit(f"FLOOD CHECK FAILED: {pattern} not reached by every rank within {timeout:g}s")
        time.sleep(0.02)


def run(ns: argparse.Namespace) -> int:
    from aioccl.bootstrap.mesh import MAX_HANDSHAKES as MAX_GATE
    from aioccl.bootstrap.ports import reserve
    from aioccl.bootstrap.root import MAX_HANDSHAKES as MAX_ROOT

    d = Path(tempfile.mkdtemp(prefix="aioccl-flood-"))
    reservation = reserve("127.0.0.1")  # the world root's port, held until rank 0 has bound it
    port = reservation.port
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AIOCCL_", "OMPI_", "PMI", "SLURM"))}
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(ns.ranks), PYTHONUNBUFFERED="1",
                **TRANSPORT_ENV[ns.transport])
    report: list[str] = []
    spray = _sprayer(["--port", str(port), "--target", "root"], 600)
    time.sleep(0.5)  # the flood is on before the first rank comes
    cmd = [sys.executable, __file__, "--worker", "--dir", str(d), "--ops", str(ns.ops), "--late", str(ns.late),
           "--transport", ns.transport]
    procs = [subprocess.Popen(cmd, env={**base, "RANK": str(r)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in range(ns.ranks)]
    pids = [str(p.pid) for p in procs]
    ok = False
    try:
        _wait_all(d, "world.*", ns.ranks, procs, 120)
        reservation.close()
        _stop(spray, "world root", report)
        for i, target in enumerate(TARGETS[ns.transport], start=1):
            spray = _sprayer(["--target", target, "--port-dir", str(d), "--pids", *pids], 600)
            time.sleep(0.3 + ns.seconds_per_phase)
            (d / f"go{i}").write_text("")
            _wait_all(d, f"done{i}.*", ns.ranks, procs, 180)
            _stop(spray, target, report)
        (d / "stopped").write_text("")
        outs = [p.communicate(timeout=120) for p in procs]
        ok = True
    finally:
        reservation.close()
        if spray.poll() is None:
            spray.kill()
        if not ok:
            for p in procs:
                p.kill()
            for p in procs:
                out, err = p.communicate()
                sys.stderr.write(f"--- rank {procs.index(p)} ---\n{out[-2000:]}{err[-4000:]}\n")
        shutil.rmtree(d, ignore_errors=True)  # the ranks' port files and barriers: nothing outlives the check
    print("\n".join(report))
    failures = []
    for r, (p, (out, err)) in enumerate(zip(procs, outs, strict=True)):
        line = next((x for x in out.splitlines() if x.startswith("{")), None)
        if p.returncode != 0 or line is None:
            failures.append(f"rank {r} exited {p.returncode}: {err[-3000:]}")
            continue
        rec = json.loads(line)
        print(line)
        if rec["fds_after"] > rec["fds_before"]:
            failures.append(f"rank {r}: {rec['fds_before']} fds before the flood, {rec['fds_after']} after")
        bound = (MAX_ROOT + MAX_GATE if r == 0 else MAX_GATE) + 2 * ns.ranks * 3 + 8  # + the round's own sockets
        if rec["fds_peak"] - rec["fds_before"] > bound:
            failures.append(f"rank {r}: {rec['fds_peak'] - rec['fds_before']} more fds at the peak, bound {bound}")
        if rec["rss_peak_kib"] - rec["rss_before_kib"] > ns.rss_peak_mib * 1024:
            failures.append(f"rank {r}: RSS peaked {(rec['rss_peak_kib'] - rec['rss_before_kib']) // 1024} MiB up")
        if rec["rss_after_kib"] - rec["rss_before_kib"] > ns.rss_slack_mib * 1024:
            failures.append(f"rank {r}: RSS grew by {(rec['rss_after_kib'] - rec['rss_before_kib']) // 1024} MiB")
    if failures:
        print("FLOOD CHECK FAILED: " + "; ".join(failures))
        return 1
    print("FLOOD CHECK PASSED")
    return 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=3)
    p.add_argument("--ops", type=int, default=200)
    p.add_argument("--late", type=float, default=1.0, help="the last rank joins each round this much later")
    p.add_argument("--seconds-per-phase", type=float, default=0.0, help="flood alone this long before a round")
    p.add_argument("--rss-slack-mib", type=float, default=8.0)
    p.add_argument("--rss-peak-mib", type=float, default=64.0, help="bound on RSS growth during the flood")
    p.add_argument("--transport", choices=tuple(TARGETS), default="shm")
    p.add_argument("--worker", action="store_true")
    p.add_argument("--dir", default="")
    ns = p.parse_args()
    if ns.worker:
        asyncio.run(worker(ns))
    else:
        sys.exit(run(ns))


if __name__ == "__main__":
    main()
