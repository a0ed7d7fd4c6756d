"""Training that survives a crashed rank: PeerLost, shrink, carry on.

Data-parallel least squares on N ranks: every step takes the same global
batch, each rank computes the gradient of its share of the rows, and an
all_reduce sums them. At ``--kill-step`` one rank is killed (SIGKILL: no
goodbye, no cleanup). The survivors' all_reduce fails with ``PeerLost``
naming it, at once; they call ``comm.shrink()``, re-split the same global
batch among themselves, redo the step and finish. Because the global batch
never changes, the final weights equal single-process full-batch training
(to rounding), which every survivor checks.

    aioccl-run --keep-going --nproc-per-node 4 examples/elastic_training.py --kill-rank 2

``--keep-going`` is what makes this possible: by default ``aioccl-run`` (like
``torchrun``) stops every rank as soon as one fails, which is right for a job
that cannot continue, and wrong for one that shrinks. With it the survivors
run on, and the launcher still ends with the first failure's exit code (137
here, for the SIGKILL) and names it: ``first failure: rank 2 was killed by
SIGKILL``. Run without a launcher (``python examples/elastic_training.py``),
the script starts itself under ``aioccl-run --keep-going``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
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


async def worker(args: argparse.Namespace) -> None:
    comm = await aioccl.init(timeout=30)
    size = comm.world_size
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
    p.add_argument("--ranks", type=int, default=4, help="ranks to start when run without a launcher")
    p.add_argument("--kill-rank", type=int, default=2)
    p.add_argument("--kill-step", type=int, default=10)
    p.add_argument("--steps", type=int, default=40)
    args = p.parse_args()
    if "AIOCCL_RANK" not in os.environ:  # not under a launcher: start the job under aioccl-run --keep-going
        os.execv(sys.executable, [sys.executable, "-m", "aioccl.run", "--keep-going", "--nproc-per-node",
                                  str(args.ranks), __file__, *sys.argv[1:]])
    asyncio.run(worker(args))


if __name__ == "__main__":
    main()
