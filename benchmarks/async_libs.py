"""What each way of awaiting costs: 8 B and 1 MiB all_reduce under asyncio (inline and proxy-thread
engines), trio (proxy thread) and blocking ``Work.wait()`` from a plain thread, in one session.

    python benchmarks/async_libs.py [--procs 2] [--iters 2000] [--repeats 3] [--out docs/bench]

Each configuration runs in fresh processes under ``aioccl-run``, configurations
back to back in rotating order per repeat. A run's time is the median
per-call time of the slowest rank (after a warm-up); the table gives the
median over repeats. Prints a markdown table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = ("asyncio-inline", "asyncio-thread", "trio", "blocking")
SIZES = (8, 1 << 20)


def rank_main(mode: str, iters: int) -> None:
    """One rank: time ``iters`` all_reduce calls per size; rank 0 prints the slowest rank's median (us)."""
    import time

    import numpy as np

    import aioccl

    async def run_async(comm: aioccl.Communicator) -> dict[int, float]:
        out = {}
        for size in SIZES:
            x = np.ones(size // 4, np.float32)
            samples = []
            for i in range(iters + iters // 10):
                t0 = time.perf_counter()
                await comm.all_reduce(x)
                if i >= iters // 10:
                    samples.append(time.perf_counter() - t0)
            out[size] = statistics.median(samples)
        return out

    async def report(comm: aioccl.Communicator, med: dict[int, float]) -> None:
        worst = np.array([med[s] for s in SIZES])
        await comm.all_reduce(worst, op="max")
        if comm.rank == 0:
            print("RESULT", json.dumps({str(s): float(v) * 1e6 for s, v in zip(SIZES, worst, strict=True)}))

    if mode.startswith("asyncio"):
        import asyncio

        async def main() -> None:
            async with await aioccl.init(engine=mode.split("-")[1]) as comm:
                await report(comm, await run_async(comm))

        asyncio.run(main())
    elif mode == "trio":
        import trio

        async def trio_main() -> None:
            async with await aioccl.init() as comm:
                await report(comm, await run_async(comm))

        trio.run(trio_main)
    else:
        comm = aioccl.init_sync()
        med = {}
        for size in SIZES:
            x = np.ones(size // 4, np.float32)
            samples = []
            for i in range(iters + iters // 10):
                t0 = time.perf_counter()
                comm.all_reduce(x).wait()
                if i >= iters // 10:
                    samples.append(time.perf_counter() - t0)
            med[size] = statistics.median(samples)
        worst = np.array([med[s] for s in SIZES])
        comm.all_reduce(worst, op="max").wait()
        if comm.rank == 0:
            print("RESULT", json.dumps({str(s): float(v) * 1e6 for s, v in zip(SIZES, worst, strict=True)}))
        comm.close().wait()


def launch(mode: str, procs: int, iters: int) -> dict[str, float]:
    p = subprocess.run([sys.executable, "-m", "aioccl.run", "--nproc-per-node", str(procs), "--no-prefix",
                        __file__, "--rank-mode", mode, "--iters", str(iters)],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if p.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT "))
    result: dict[str, float] = json.loads(line[len("RESULT "):])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--rank-mode", choices=MODES, help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.rank_mode:
        rank_main(ns.rank_mode, ns.iters)
        return
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for rep in range(ns.repeats):
        order = MODES[rep % len(MODES):] + MODES[:rep % len(MODES)]
        for mode in order:
            runs[mode].append(launch(mode, ns.procs, ns.iters))
            print(f"# repeat {rep + 1} {mode}: {runs[mode][-1]}", file=sys.stderr, flush=True)
    table = {m: {str(s): statistics.median(r[str(s)] for r in runs[m]) for s in SIZES} for m in MODES}
    lines = [f"{ns.procs} ranks on one host (shared memory), float32 all_reduce in place, median of {ns.repeats} "
             f"runs (each the median per call of the slowest rank, {ns.iters} calls):", "",
             "| how the caller waits | 8 B | 1 MiB |", "|---|---:|---:|"]
    for m in MODES:
        lines.append(f"| {m} | {table[m]['8']:.1f} us | {table[m][str(1 << 20)]:.1f} us |")
    text = "\n".join(lines)
    print(text)
    if ns.out:
        ns.out.mkdir(parents=True, exist_ok=True)
        (ns.out / "async_libs.md").write_text(text + "\n")
        (ns.out / "async_libs.json").write_text(json.dumps({"procs": ns.procs, "iters": ns.iters, "runs": runs,
                                                            "median_us": table}, indent=1) + "\n")


if __name__ == "__main__":
    main()
