"""DDP training steps with backend "aioccl" against "gloo", side by side in one session (torchrun, CPU).

    python benchmarks/torch_ddp.py --ranks 2,4 --repeats 3 --out docs/bench

The model is an MLP of about 25M float32 parameters (2048 -> 4096 -> 4096 -> 16), 16 samples per rank (``--batch``); a
step is forward, backward (DDP's bucketed all_reduces overlap it) and SGD, timed as the median over steps
of the slowest rank, next to the same step without DDP (what communication adds to it). Also timed:
``dist.all_reduce`` of 8 bytes through each backend and, for aioccl, the same through its own API on the
group's communicator. The backends run alternately in each repeat; each figure is the median over
repeats. ``--handoff`` adds aioccl with ``AIOCCL_BORROW_BYTES=0``: every op handed to the engine's thread
(no op run inside torch's call), for comparison. ``--load hog2`` runs every run beside a background load
(``_load.py``: one or two CPU-bound processes, or a mixed load), started afresh for each. Writes torch_ddp.md
and torch_ddp.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _load import LOADS, load  # noqa: E402

SIZES = (2048, 4096, 4096, 16)
RESULT = re.compile(r"^RESULT (\{.*\})$", re.M)


def worker(backend: str, steps: int, warmup: int, calls: int, batch: int) -> None:
    dist.init_process_group(backend)
    r = dist.get_rank()
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for a, b in zip(SIZES, SIZES[1:], strict=False):
        layers += [nn.Linear(a, b), nn.ReLU()]
    plain = nn.Sequential(*layers[:-1])
    x, y = torch.randn(batch, SIZES[0]), torch.randn(batch, SIZES[-1])
    compute = _steps(plain, x, y, steps, warmup)  # the same step without DDP: what communication adds to
    model = nn.parallel.DistributedDataParallel(plain)
    per = _steps(model, x, y, steps, warmup)
    small = torch.zeros(2)
    lat = _latency(lambda: dist.all_reduce(small), calls)
    own = None
    if backend == "aioccl":
        comm = dist.distributed_c10d._get_default_group().comm  # the group's aioccl communicator
        own = _latency(lambda: comm.all_reduce(small).wait(), calls)
    worst = torch.tensor([statistics.median(per), lat, own or 0.0, statistics.median(compute)], dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    if r == 0:
        params = sum(p.numel() for p in model.parameters())
        print("RESULT " + json.dumps({"step_s": worst[0].item(), "allreduce_8B_us": worst[1].item() * 1e6,
                                      "aioccl_api_8B_us": worst[2].item() * 1e6 if own else None,
                                      "compute_s": worst[3].item(), "params": params}), flush=True)
    dist.destroy_process_group()


def _steps(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, warmup: int) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    per = []
    for step in range(warmup + steps):
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if step >= warmup:
            per.append(time.perf_counter() - t0)
    return per


def _latency(fn, calls: int) -> float:
    for _ in range(calls // 10):
        fn()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def run(label: str, n: int, args: argparse.Namespace) -> dict:
    from aioccl.bootstrap.ports import reserve

    backend = label.split("-")[0]
    extra = {"AIOCCL_BORROW_BYTES": "0"} if label == "aioccl-handoff" else {}

    with reserve("127.0.0.1", count=2) as ports:  # torch's store, and aioccl's root on the next port
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n), "--master-port",
               str(ports.port), __file__, "--worker", backend, "--steps", str(args.steps),
               "--calls", str(args.calls), "--batch", str(args.batch)]
        with load(args.load):
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                               env={**os.environ, **extra, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // n))})
    found = RESULT.search(p.stdout)
    if p.returncode or found is None:
        raise SystemExit(f"{label} x{n} failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return json.loads(found[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=16, help="samples per rank and step")
    ap.add_argument("--out", default=None)
    ap.add_argument("--handoff", action="store_true", help="also aioccl with every op on the engine's thread")
    ap.add_argument("--load", default="none", choices=LOADS, help="a background load beside every run")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.steps, 2, args.calls, args.batch)
        return
    runs: dict[str, list[dict]] = {}
    for rep in range(args.repeats):
        for n in map(int, args.ranks.split(",")):
            labels = ("aioccl", "gloo", *(("aioccl-handoff",) if args.handoff else ()))
            for backend in (labels if rep % 2 == 0 else labels[::-1]):
                res = run(backend, n, args)
                runs.setdefault(f"{backend} x{n}", []).append(res)
                print(f"repeat {rep + 1}/{args.repeats} {backend} x{n}: step {res['step_s'] * 1e3:.1f} ms, "
                      f"8 B all_reduce {res['allreduce_8B_us']:.1f} us", flush=True)
    med = {k: {f: statistics.median(r[f] for r in v) for f in ("step_s", "allreduce_8B_us", "compute_s")}
           for k, v in runs.items()}
    lines = [f"Command: `benchmarks/torch_ddp.py --ranks {args.ranks} --repeats {args.repeats} --steps {args.steps} "
             f"--batch {args.batch} --load {args.load}`",
             f"torch {torch.__version__}, {next(iter(runs.values()))[0]['params'] / 1e6:.1f}M parameters, "
             f"medians of {args.repeats} runs", "",
             "| ranks | aioccl step | gloo step | gloo / aioccl | step without DDP | added by aioccl | added by gloo "
             "| aioccl 8 B all_reduce | aioccl API 8 B | gloo 8 B all_reduce | gloo / aioccl (8 B) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for n in map(int, args.ranks.split(",")):
        a, g = med[f"aioccl x{n}"], med[f"gloo x{n}"]
        api = statistics.median(r["aioccl_api_8B_us"] for r in runs[f"aioccl x{n}"])
        base = statistics.median([a["compute_s"], g["compute_s"]])
        lines.append(f"| {n} | {a['step_s'] * 1e3:.1f} ms | {g['step_s'] * 1e3:.1f} ms | "
                     f"{g['step_s'] / a['step_s']:.2f}x | {base * 1e3:.1f} ms | "
                     f"{(a['step_s'] - a['compute_s']) * 1e3:.1f} ms | "
                     f"{(g['step_s'] - g['compute_s']) * 1e3:.1f} ms | {a['allreduce_8B_us']:.1f} us | {api:.1f} us | "
                     f"{g['allreduce_8B_us']:.1f} us | {g['allreduce_8B_us'] / a['allreduce_8B_us']:.1f}x |")
    if args.handoff:
        lines += ["", "| ranks | aioccl 8 B all_reduce | the same, every op handed to the engine's thread "
                  "| aioccl step | the same, handed over |", "|---|---|---|---|---|"]
        for n in map(int, args.ranks.split(",")):
            a, h = med[f"aioccl x{n}"], med[f"aioccl-handoff x{n}"]
            lines.append(f"| {n} | {a['allreduce_8B_us']:.1f} us | {h['allreduce_8B_us']:.1f} us | "
                         f"{a['step_s'] * 1e3:.1f} ms | {h['step_s'] * 1e3:.1f} ms |")
    print("\n".join(lines))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "torch_ddp.md").write_text("\n".join(lines) + "\n")
        (out / "torch_ddp.json").write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
