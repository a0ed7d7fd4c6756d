"""The measuring loop shared by the peer runners, the same method as aioccl-perf.

Per size: one check on exact data, warm-up, a barrier, then ``iters`` ops back
to back, each timed. Per rank: loop time / iters (nccl-tests' time) and the
median per-iteration time; across ranks: the average of the former and the
max of the latter (``median_us``, what compare.py reports).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "pingpong")


def busbw_factor(op: str, n: int) -> float:
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n if op in ("all_gather", "reduce_scatter") else 1.0


def counts(op: str, nbytes: int, n: int) -> tuple[int, int]:
    """(elements per rank input, elements of the whole buffer) for float32, as nccl-tests sizes them."""
    total = nbytes // 4
    if op in ("all_gather", "reduce_scatter"):
        block = total // n
        return (block if op == "all_gather" else block * n), block * n
    return total, total


def iterations(nbytes: int) -> tuple[int, int]:
    iters = int(min(200, max(5, (64 << 20) // max(nbytes, 1))))
    return iters, max(2, iters // 10)


def measure(run: Callable[[], None], check: Callable[[], int], barrier: Callable[[], None],
            reduce_stats: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]], nbytes: int,
            n: int, legs: int = 1) -> dict[str, float]:
    """``reduce_stats(v)`` -> (sum over ranks, max over ranks) of the vector v; ``legs``: one-way messages
    in series per run (ping-pong: 2), so its times are one-way, as aioccl-perf reports them."""
    wrong = check()
    iters, warm = iterations(nbytes)
    for _ in range(warm):
        run()
    barrier()
    per = []
    t_loop = time.perf_counter()
    for _ in range(iters):
        t0 = time.perf_counter()
        run()
        per.append((time.perf_counter() - t0) / legs)
    loop = (time.perf_counter() - t_loop) / iters / legs
    total, worst = reduce_stats(np.array([loop, float(np.median(per)), wrong], np.float64))
    return {"mean_us": total[0] / n * 1e6, "median_us": worst[1] * 1e6, "wrong": int(total[2]),
            "iters": iters}


def values(rank: int, count: int) -> np.ndarray:
    return (1 + (np.arange(count) * 3 + rank * 5) % 7).astype(np.float32)


def sweep(lib: str, op: str, n: int, sizes: list[int], setup: Callable[[int, int, int], tuple],
          barrier: Callable[[], None], reduce_stats: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
          ) -> list[dict]:
    """Every size: ``setup(elements in, elements of the whole buffer, block)`` -> (run, check), then
    :func:`measure`. Returns the points (identical on every rank; rank 0 reports them)."""
    points = []
    for nbytes in sizes:
        inp, total = counts(op, nbytes, n)
        if inp == 0:
            continue
        run, check = setup(inp, total, total // n)
        res = measure(run, check, barrier, reduce_stats, total * 4, n, 2 if op == "pingpong" else 1)
        points.append({"lib": lib, "op": op, "ranks": n, "bytes": total * 4, **res,
                       "busbw": total * 4 / (res["median_us"] * 1e-6) / 1e9 * busbw_factor(op, n)})
    return points
