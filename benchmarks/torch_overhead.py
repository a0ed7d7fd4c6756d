"""What a torch user pays: all_reduce of torch CPU tensors through aioccl, against the same through numpy
arrays, and against torch.distributed's own Gloo backend, in one session.

    python benchmarks/torch_overhead.py [--procs 2] [--iters 2000] [--repeats 3] [--out docs/bench]

Each configuration runs in fresh processes under ``aioccl-run`` (Gloo is
initialised from the same rank numbers over TCP on loopback), back to back in
rotating order per repeat. A run's time is the median per-call time of the
slowest rank after a warm-up; the table gives the median over repeats.
Results are checked once per size (exact small integers).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = ("aioccl-numpy", "aioccl-torch", "gloo")
SIZES = (8, 1 << 16, 1 << 20)


def rank_main(mode: str, iters: int, port: int) -> None:
    import numpy as np
    import torch

    torch.set_num_threads(1)
    rank, n = int(os.environ["AIOCCL_RANK"]), int(os.environ["AIOCCL_WORLD_SIZE"])
    med: dict[int, float] = {}
    if mode == "gloo":
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
        for size in SIZES:
            x = torch.full((size // 4,), float(rank + 1))
            dist.all_reduce(x)
            assert bool((x == n * (n + 1) / 2).all())
            samples = []
            for i in range(iters + iters // 10):
                t0 = time.perf_counter()
                dist.all_reduce(x)
                if i >= iters // 10:
                    samples.append(time.perf_counter() - t0)
            med[size] = statistics.median(samples)
        worst = torch.tensor([med[s] for s in SIZES], dtype=torch.float64)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        if rank == 0:
            print("RESULT", json.dumps({str(s): float(v) * 1e6 for s, v in zip(SIZES, worst, strict=True)}))
        dist.destroy_process_group()
        return

    import asyncio

    import aioccl

    async def main() -> None:
        async with await aioccl.init() as comm:
            for size in SIZES:
                t = torch.full((size // 4,), float(rank + 1))
                x = t if mode == "aioccl-torch" else t.numpy()
                await comm.all_reduce(x)
                assert bool((t == n * (n + 1) / 2).all())
                samples = []
                for i in range(iters + iters // 10):
                    t0 = time.perf_counter()
                    await comm.all_reduce(x)
                    if i >= iters // 10:
                        samples.append(time.perf_counter() - t0)
                med[size] = statistics.median(samples)
            worst = np.array([med[s] for s in SIZES])
            await comm.all_reduce(worst, op="max")
            if rank == 0:
                print("RESULT", json.dumps({str(s): float(v) * 1e6 for s, v in zip(SIZES, worst, strict=True)}))

    asyncio.run(main())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def launch(mode: str, procs: int, iters: int) -> dict[str, float]:
    p = subprocess.run([sys.executable, "-m", "aioccl.run", "--nproc-per-node", str(procs), "--no-prefix",
                        __file__, "--rank-mode", mode, "--iters", str(iters), "--port", str(free_port())],
                       capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT)})
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
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.rank_mode:
        rank_main(ns.rank_mode, ns.iters, ns.port)
        return
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for rep in range(ns.repeats):
        for mode in MODES[rep % len(MODES):] + MODES[:rep % len(MODES)]:
            runs[mode].append(launch(mode, ns.procs, ns.iters))
            print(f"# repeat {rep + 1} {mode}: {runs[mode][-1]}", file=sys.stderr, flush=True)
    table = {m: {str(s): statistics.median(r[str(s)] for r in runs[m]) for s in SIZES} for m in MODES}
    import torch

    lines = [f"{ns.procs} ranks on one host, float32 all_reduce in place, torch {torch.__version__}, median of "
             f"{ns.repeats} runs (each the median per call of the slowest rank, {ns.iters} calls):", "",
             "| | 8 B | 64 KiB | 1 MiB |", "|---|---:|---:|---:|"]
    names = {"aioccl-numpy": "aioccl, numpy array", "aioccl-torch": "aioccl, torch tensor",
             "gloo": "torch.distributed (Gloo)"}
    for m in MODES:
        lines.append(f"| {names[m]} | " + " | ".join(f"{table[m][str(s)]:.1f} us" for s in SIZES) + " |")
    text = "\n".join(lines)
    print(text)
    if ns.out:
        ns.out.mkdir(parents=True, exist_ok=True)
        (ns.out / "torch_overhead.md").write_text(text + "\n")
        (ns.out / "torch_overhead.json").write_text(json.dumps({"procs": ns.procs, "iters": ns.iters, "runs": runs,
                                                                "median_us": table}, indent=1) + "\n")


if __name__ == "__main__":
    main()
