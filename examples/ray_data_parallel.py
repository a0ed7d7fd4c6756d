"""Data-parallel training steps on Ray async actors, averaged with aioccl's awaitable all_reduce.

    python examples/ray_data_parallel.py [--actors 4] [--steps 5]

The driver starts the actors and declares them a group (``aioccl.ray.create_group``: actor i is rank i); each
actor forms it with ``await aioccl.ray.init_group(name=...)`` and trains a linear model on its own shard:
gradient, ``await comm.all_reduce(grad, "avg")``, step. While an all_reduce waits, the actor's event loop stays
free for its other coroutines and method calls (tests/test_ray.py measures it).
The driver checks that every actor ends with the same weights as one process stepping on all the shards'
mean gradient, exactly (integer data and a learning rate that is a power of two keep every value exact).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile

import numpy as np
import ray

import aioccl.ray

FEATURES, ROWS, LR = 4, 8, 0.125


def shard(rank: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """Actor ``rank``'s minibatch at ``step``: small integers."""
    x = ((np.arange(ROWS * FEATURES).reshape(ROWS, FEATURES) + rank + step) % 3).astype(np.float64)
    y = ((np.arange(ROWS) + 2 * rank) % 4).astype(np.float64)
    return x, y


def gradient(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return x.T @ (x @ w - y) / ROWS  # type: ignore[no-any-return]


@ray.remote
class Trainer:
    async def train(self, group: str, steps: int) -> list[float]:
        comm = await aioccl.ray.init_group(name=group)  # rank and size as the driver declared them
        w = np.zeros(FEATURES)
        async with comm:
            for step in range(steps):
                g = gradient(w, *shard(comm.rank, step))
                await comm.all_reduce(g, "avg")
                w -= LR * g
        return w.tolist()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--actors", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    a = p.parse_args()
    folder = tempfile.mkdtemp(prefix="r")  # Ray's own files; short, for its Unix sockets' paths live under it
    ray.init(num_cpus=max(4, a.actors), include_dashboard=False, log_to_driver=False, _temp_dir=folder)
    try:
        actors = [Trainer.remote() for _ in range(a.actors)]  # type: ignore[attr-defined]
        aioccl.ray.create_group(actors, "data-parallel")
        results = ray.get([t.train.remote("data-parallel", a.steps) for t in actors], timeout=300)
    finally:
        ray.shutdown()
        shutil.rmtree(folder, ignore_errors=True)
    w = np.zeros(FEATURES)  # one process, every shard's gradient averaged
    for step in range(a.steps):
        w -= LR * sum(gradient(w, *shard(r, step)) for r in range(a.actors)) / a.actors
    for rank, got in enumerate(results):
        if got != w.tolist():
            raise SystemExit(f"actor {rank}: weights {got}, expected {w.tolist()}")
    print(f"{a.actors} actors, {a.steps} steps: every actor's weights {np.round(w, 4).tolist()}, exactly")


if __name__ == "__main__":
    main()
