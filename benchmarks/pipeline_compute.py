"""Compute beside communication: a 4-stage 1F1B pipeline with torch compute per stage, aioccl against Gloo.

    python benchmarks/pipeline_compute.py --repeats 3 --loads none,hog2 --out docs/bench/compute

Each stage holds one Linear(W, W) layer (float32); a step runs ``--micro-batches`` microbatches of
``rows x W`` activations (4 MiB by default) on the 1F1B schedule (examples/pipeline_1f1b.py's): forward
activations up, gradients down, every receive posted ahead of its use, sends never waited for until the step
ends. Compute per microbatch is the layer's forward and its backward (two matmuls), so ranks compute while
their messages move: how each library waits decides how much of the cores the computing ranks keep.

Libraries: **aioccl** (its asyncio API, engine inline: ``isend``/``irecv`` awaited) and **gloo**
(``torch.distributed`` isend/irecv, ``work.wait()``), each with ``OMP_NUM_THREADS=1`` in every rank, the
ranks started by ``aioccl-run`` (aioccl) and ``torchrun`` (Gloo). The time is the slowest stage's per step
(median over steps, after a warm-up step); per repeat the libraries run in rotating order, and beside each
``--loads`` background load (``_load.py``: hog1, hog2 = one or two CPU-bound processes) started afresh for
each run. Reported: medians over repeats, and aioccl's time over Gloo's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _load import load  # noqa: E402

RESULT = re.compile(r"RESULT (\{.*\})")
FORWARD, BACKWARD = 0, 1


class Gloo:
    """torch.distributed's point-to-point, as the schedule asks for it."""

    def __init__(self) -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        self.dist = dist
        self.rank, self.size = dist.get_rank(), dist.get_world_size()

    def send(self, t: Any, peer: int, tag: int) -> Any:
        return self.dist.isend(t, peer, tag=tag)

    def recv(self, t: Any, peer: int, tag: int) -> Any:
        return self.dist.irecv(t, peer, tag=tag)

    async def wait(self, h: Any) -> None:
        h.wait()

    async def slowest(self, seconds: float) -> float:
        import torch

        t = torch.tensor([seconds], dtype=torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return float(t.item())

    async def close(self) -> None:
        self.dist.destroy_process_group()


class Aioccl:
    """aioccl's own asyncio API, the engine inline on this loop."""

    async def start(self) -> Aioccl:
        import aioccl

        self.comm = await aioccl.init(timeout=120)
        self.rank, self.size = self.comm.rank, self.comm.world_size
        return self

    def send(self, t: Any, peer: int, tag: int) -> Any:
        return self.comm.isend(t, peer, tag=tag)

    def recv(self, t: Any, peer: int, tag: int) -> Any:
        return self.comm.irecv(t, peer, tag=tag)

    async def wait(self, h: Any) -> None:
        await h

    async def slowest(self, seconds: float) -> float:
        import numpy as np

        t = np.array([seconds])
        await self.comm.all_reduce(t, op="max")
        return float(t[0])

    async def close(self) -> None:
        await self.comm.close()


async def one_step(lib: Any, layer: Any, m: int, rows: int, width: int, depth: int) -> None:
    """One 1F1B step of this stage: forwards to fill the pipe, then one forward and one backward each turn."""
    import torch

    n, s = lib.size, lib.rank
    ins = {d: [torch.empty(rows, width) for _ in range(depth)] for d in (FORWARD, BACKWARD)}
    posted: dict[int, dict[int, Any]] = {FORWARD: {}, BACKWARD: {}}
    src = {FORWARD: s - 1, BACKWARD: s + 1}

    def post(d: int, i: int) -> None:
        if 0 <= src[d] < n and i < m:
            posted[d][i] = lib.recv(ins[d][i % depth], src[d], d)

    async def take(d: int, i: int) -> Any:
        await lib.wait(posted[d].pop(i))
        item = ins[d][i % depth].clone()
        post(d, i + depth)
        return item

    for d in (FORWARD, BACKWARD):
        for i in range(depth):
            post(d, i)
    held: dict[int, Any] = {}
    outs: dict[int, Any] = {}
    sends: list[Any] = []
    x0 = torch.ones(rows, width)

    async def forward(i: int) -> None:
        x = await take(FORWARD, i) if s > 0 else x0
        x.requires_grad_(True)
        y = layer(x)
        held[i] = (x, y)
        if s < n - 1:
            sends.append(lib.send(y.detach(), s + 1, FORWARD))
        else:
            outs[i] = y.detach()

    async def backward(i: int) -> None:
        g = await take(BACKWARD, i) if s < n - 1 else outs.pop(i)
        x, y = held.pop(i)
        y.backward(g)
        if s > 0:
            sends.append(lib.send(x.grad, s - 1, BACKWARD))

    warm = min(n - s - 1, m)
    for i in range(warm):
        await forward(i)
    for i in range(m - warm):
        await forward(i + warm)
        await backward(i)
    for i in range(m - warm, m):
        await backward(i)
    for h in sends:
        await lib.wait(h)


async def worker(kind: str, steps: int, m: int, rows: int, width: int, depth: int) -> None:
    import torch

    lib = Gloo() if kind == "gloo" else await Aioccl().start()
    torch.manual_seed(lib.rank)
    layer = torch.nn.Linear(width, width)
    per = []
    for step in range(steps + 1):
        t0 = time.perf_counter()
        await one_step(lib, layer, m, rows, width, depth)
        with torch.no_grad():
            layer.weight.mul_(0.5)  # (a stand-in for the optimizer: values stay bounded)
        if step:
            per.append(time.perf_counter() - t0)
    worst = await lib.slowest(statistics.median(per))
    if lib.rank == 0:
        print("RESULT " + json.dumps({"step_s": worst, "threads": torch.get_num_threads()}), flush=True)
    await lib.close()


def run(kind: str, args: argparse.Namespace) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent)}
    wargs = [str(HERE / "pipeline_compute.py"), "--worker", kind, "--steps", str(args.steps), "--micro-batches",
             str(args.micro_batches), "--rows", str(args.rows), "--width", str(args.width), "--depth", str(args.depth)]
    if kind == "gloo":
        from aioccl.bootstrap.ports import reserve

        with reserve("127.0.0.1", count=1) as port:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.stages),
                   "--master-port", str(port.port), *wargs]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    else:
        cmd = [sys.executable, "-m", "aioccl.run", "--nproc-per-node", str(args.stages), *wargs]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    found = RESULT.search(p.stdout)
    if p.returncode or found is None:
        raise SystemExit(f"{kind} failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    got = json.loads(found[1])
    assert got["threads"] == 1, got
    return float(got["step_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--micro-batches", type=int, default=16)
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--width", type=int, default=1024, help="rows x width float32: 4 MiB activations by default")
    ap.add_argument("--depth", type=int, default=3, help="receives posted ahead, per direction")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--loads", default="none,hog2")
    ap.add_argument("--libs", default="aioccl,gloo")
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        asyncio.run(worker(args.worker, args.steps, args.micro_batches, args.rows, args.width, args.depth))
        return
    libs = args.libs.split(",")
    times: dict[tuple[str, str], list[float]] = {}
    for rep in range(args.repeats):
        for kind in args.loads.split(","):
            for lib in libs if rep % 2 == 0 else libs[::-1]:
                with load(kind):
                    t = run(lib, args)
                times.setdefault((lib, kind), []).append(t)
                print(f"repeat {rep + 1}/{args.repeats} load {kind} {lib}: {t:.3f} s a step", flush=True)
    lines = [f"Command: `benchmarks/pipeline_compute.py --stages {args.stages} --micro-batches {args.micro_batches} "
             f"--rows {args.rows} --width {args.width} --steps {args.steps} --repeats {args.repeats} "
             f"--loads {args.loads}`", "", "| load | " + " | ".join(f"{lib} s/step" for lib in libs)
             + " | aioccl / gloo | runs (aioccl; gloo) |", "|---|" + "---|" * (len(libs) + 2)]
    for kind in args.loads.split(","):
        med = {lib: statistics.median(times[(lib, kind)]) for lib in libs}
        ratio = f"{med['aioccl'] / med['gloo']:.2f}x" if "aioccl" in med and "gloo" in med else "-"
        runs = "; ".join(", ".join(f"{t:.2f}" for t in times[(lib, kind)]) for lib in libs)
        lines.append(f"| {kind} | " + " | ".join(f"{med[lib]:.3f}" for lib in libs) + f" | {ratio} | {runs} |")
    print("\n".join(lines))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "pipeline_compute.md").write_text("\n".join(lines) + "\n")
        (out / "pipeline_compute.json").write_text(json.dumps({f"{k[0]} {k[1]}": v for k, v in times.items()}))


if __name__ == "__main__":
    main()
