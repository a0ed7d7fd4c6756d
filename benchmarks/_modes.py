"""Shared by the benchmarks that compare ways of running the same op (async_libs.py, torch_overhead.py).

Each configuration ("mode") runs in fresh processes under ``aioccl-run``; the
modes go back to back in rotating order per repeat; a run's number is the
median per-call time of the slowest rank, which rank 0 prints as one
``RESULT {json}`` line; the report is the median over repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parser(doc: str | None, modes: Sequence[str]) -> argparse.ArgumentParser:
    """The options every mode benchmark takes; ``--rank-mode`` is how a launched rank learns its mode."""
    ap = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--rank-mode", choices=modes, help=argparse.SUPPRESS)
    return ap


def warm_median(samples: list[float], iters: int) -> float:
    """The median of the last ``iters`` samples (the ones before are the warm-up)."""
    return statistics.median(samples[-iters:])


async def time_async(call: Callable[[], Awaitable[object]], iters: int) -> float:
    samples = []
    for _ in range(iters + iters // 10):
        t0 = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - t0)
    return warm_median(samples, iters)


def time_sync(call: Callable[[], object], iters: int) -> float:
    samples = []
    for _ in range(iters + iters // 10):
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    return warm_median(samples, iters)


def torch_rows(sizes: Sequence[int], rank: int, want: float, iters: int) -> None:
    """Time ``dist.all_reduce`` of a float32 tensor per size in an initialized process group (checked first
    against ``want``), print the slowest rank's line on rank 0, and destroy the group."""
    import torch
    import torch.distributed as dist

    med = []
    for size in sizes:
        t = torch.full((size // 4,), float(rank + 1))
        dist.all_reduce(t)
        assert bool((t == want).all())
        med.append(time_sync(lambda t=t: dist.all_reduce(t), iters))
    worst = torch.tensor(med, dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(result_line(sizes, worst.tolist()), flush=True)
    dist.destroy_process_group()


def result_line(sizes: Sequence[int], worst_s: Sequence[float]) -> str:
    """What rank 0 prints: microseconds per size."""
    return "RESULT " + json.dumps({str(s): float(v) * 1e6 for s, v in zip(sizes, worst_s, strict=True)})


def launch(script: str, mode: str, procs: int, args: Sequence[str]) -> dict[str, float]:
    p = subprocess.run([sys.executable, "-m", "aioccl.run", "--nproc-per-node", str(procs), "--no-prefix", script,
                        "--rank-mode", mode, *args], capture_output=True, text=True, timeout=900,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    if p.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT "))
    result: dict[str, float] = json.loads(line[len("RESULT "):])
    return result


def rotate(modes: Sequence[str], repeats: int, run: Callable[[str], dict[str, float]]
           ) -> dict[str, list[dict[str, float]]]:
    """Every mode once per repeat, starting one mode later each repeat."""
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for rep in range(repeats):
        for mode in [*modes[rep % len(modes):], *modes[:rep % len(modes)]]:
            runs[mode].append(run(mode))
            print(f"# repeat {rep + 1} {mode}: {runs[mode][-1]}", file=sys.stderr, flush=True)
    return runs


def medians(runs: dict[str, list[dict[str, float]]], sizes: Sequence[int]) -> dict[str, dict[str, float]]:
    return {m: {str(s): statistics.median(r[str(s)] for r in rs) for s in sizes} for m, rs in runs.items()}


def save(out: Path | None, name: str, text: str, data: dict[str, object]) -> None:
    print(text)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{name}.md").write_text(text + "\n")
        (out / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")
