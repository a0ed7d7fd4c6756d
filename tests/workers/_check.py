"""Shared helpers for test workers run under aioccl-run: exact data, poison, bit-exact checks."""

from __future__ import annotations

import sys

import ml_dtypes
import numpy as np

DTYPES = [np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64, np.float16, ml_dtypes.bfloat16,
          np.float32, np.float64]
FLOATS = {np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32), np.dtype(np.float64)}


def values(rank: int, count: int, op: str = "sum") -> np.ndarray:
    """Small integers (exact in every dtype, sums of 5 ranks fit int8 and bfloat16): ``1 + (i*3 + rank*5) % 7``
    at index ``i`` (``1 + (i + rank) % 2`` for products, which stay <= 32 over 5 ranks).

    Made by repeating one period (7, or 2), the same numbers as the formula at every index: the soak and the
    matrix call this for every op, and the modulo over a quarter-million elements was a third of their CPU."""
    return _repeat(_period(rank, op), count)


def _period(rank: int, op: str) -> np.ndarray:
    i = np.arange(2 if op == "prod" else 7)
    return 1 + (i + rank) % 2 if op == "prod" else 1 + (i * 3 + rank * 5) % 7


def _repeat(period: np.ndarray, count: int) -> np.ndarray:
    """``period`` repeated to ``count`` elements (np.resize would concatenate count/len(period) copies)."""
    return np.tile(period, -(-count // len(period)))[:count]


def data(rank: int, count: int, dt: type, op: str = "sum") -> np.ndarray:
    return values(rank, count, op).astype(dt)


def poison(shape: tuple[int, ...] | int, dt: type) -> np.ndarray:
    dt = np.dtype(dt)
    if dt in FLOATS:
        return np.full(shape, np.nan, dtype=dt)
    return np.full(shape, np.iinfo(dt).max if dt.kind == "u" else -1, dtype=dt)


def reduced(n: int, count: int, dt: type, op: str) -> np.ndarray:
    """What ``op`` over ranks ``0..n-1``'s :func:`values` gives, in ``dt``: reduced over one period, then
    repeated (every rank's values share the period)."""
    stack = np.stack([_period(r, op) for r in range(n)])
    if op in ("sum", "avg"):
        out = _repeat(stack.sum(0), count).astype(dt)
        if op == "avg":
            np.divide(out, n, out=out, casting="unsafe")
        return out
    if op == "prod":
        return _repeat(stack.prod(0), count).astype(dt)
    return _repeat(stack.min(0) if op == "min" else stack.max(0), count).astype(dt)


def ops_for(dt: type) -> list[str]:
    return ["sum", "prod", "min", "max"] + (["avg"] if np.dtype(dt) in FLOATS else [])


class Checker:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.count = 0
        self.failures: list[str] = []

    def same(self, what: str, got: object, want: np.ndarray) -> None:
        self.count += 1
        got = np.asarray(got)
        if got.dtype != want.dtype or got.shape != want.shape or \
                got.tobytes() != np.ascontiguousarray(want).tobytes():
            self.failures.append(f"rank {self.rank}: {what}: got {got.dtype}{got.shape} {got.ravel()[:8]} "
                                 f"want {want.dtype}{want.shape} {want.ravel()[:8]}")

    def true(self, what: str, cond: bool) -> None:
        self.count += 1
        if not cond:
            self.failures.append(f"rank {self.rank}: {what}")

    def finish(self, label: str) -> None:
        for f in self.failures[:20]:
            print("FAIL", f, flush=True)
        print(f"{label}: {self.count} checks, {len(self.failures)} failures", flush=True)
        if self.failures:
            sys.exit(1)
