"""Training that survives a crashed rank: PeerLost, shrink, carry on.

Data-parallel least squares on N ranks: every step takes the same global
batch, each rank computes the gradient of its share of the rows, and an
all_reduce sums them. At ``--kill-step`` one rank is killed (SIGKILL: no
goodbye, no cleanup). The survivors' all_reduce fails with ``PeerLost``
within the peer timeout; they call ``comm.shrink()``, re-split the same
global batch among themselves, redo the step and finish. Because the global
batch never changes, the final weights equal single-process full-batch
training (to rounding), which every survivor checks.

    python examples/elastic_training.py [--ranks 4] [--kill-rank 2] [--kill-step 10] [--steps 40]

The script starts its own ranks (subprocesses joined by a unique id) rather
than running under ``aioccl-run``, because the launcher's job is the opposite
one: stop everything when a rank fails.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time

import numpy as np

import aioccl

ROWS, BATCH, DIM, LR = 240, 24, 8, 0.05


def dataset() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.integers(-3, 4, size=(ROWS, DIM)).astype(np.float64)
    w_true = rng.integers(-2, 3, size=DIM).astype(np.float64)
    return x, x @ w_true + rng.integers(-1, 2, size=ROWS)


def batch(step: int) -> np.ndarray:
    start = step * BATCH % ROWS
    return np.arange(start, start + BATCH) % ROWS


def grad(x: np.ndarray, y: np.ndarray, w: np.ndarray, rows: np.ndarray) -> np.ndarray:
    xb = x[rows]
    g: np.ndarray = xb.T @ (xb @ w - y[rows])
    return g


def reference(steps: int) -> np.ndarray:
    x, y = dataset()
    w = np.zeros(DIM)
    for s in range(steps):
        w -= LR * grad(x, y, w, batch(s)) / BATCH
    return w


async def worker(uid: str, rank: int, size: int, args: argparse.Namespace) -> None:
    comm = await aioccl.Communicator.create(uid, rank, size, timeout=30)
    x, y = dataset()
    w = np.zeros(DIM)
    step = 0
    while step < args.steps:
        if step == args.kill_step and comm.rank == args.kill_rank and comm.world_size == size:
            os.kill(os.getpid(), signal.SIGKILL)
        mine = np.array_split(batch(step), comm.world_size)[comm.rank]  # my share of the global batch
        t0 = time.perf_counter()
        try:
            g = await comm.all_reduce(grad(x, y, w, mine))
        except aioccl.PeerLost as e:
            print(f"step {step}: PeerLost(rank {e.rank}) after {time.perf_counter() - t0:.2f}s; shrinking",
                  flush=True)
            comm = await comm.shrink()
            print(f"step {step}: now rank {comm.rank} of {comm.world_size}; redoing the step", flush=True)
            continue
        w -= LR * g / BATCH
        step += 1
    err = float(np.max(np.abs(w - reference(args.steps))))
    x_all, y_all = dataset()
    loss = float(np.mean((x_all @ w - y_all) ** 2))
    print(f"finished {args.steps} steps on {comm.world_size} ranks: loss {loss:.4f}, "
          f"max |w - single-process w| = {err:.2e}", flush=True)
    await comm.close()
    if err > 1e-9:
        raise SystemExit(f"weights differ from single-process training by {err}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--kill-rank", type=int, default=2)
    p.add_argument("--kill-step", type=int, default=10)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--worker", nargs=2, metavar=("UID", "RANK"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        asyncio.run(worker(args.worker[0], int(args.worker[1]), args.ranks, args))
        return
    uid = str(aioccl.UniqueId.new(host="127.0.0.1"))
    argv = [sys.executable, __file__, "--ranks", str(args.ranks), "--kill-rank", str(args.kill_rank),
            "--kill-step", str(args.kill_step), "--steps", str(args.steps)]
    procs = [subprocess.Popen([*argv, "--worker", uid, str(r)]) for r in range(args.ranks)]
    codes = [proc.wait(timeout=300) for proc in procs]
    survivors_ok = all(c == 0 for r, c in enumerate(codes) if r != args.kill_rank)
    print(f"exit codes {codes}: rank {args.kill_rank} was killed, "
          f"{'the survivors finished' if survivors_ok else 'a survivor FAILED'}")
    sys.exit(0 if survivors_ok and codes[args.kill_rank] == -signal.SIGKILL else 1)


if __name__ == "__main__":
    main()
