"""What ``aioccl-perf`` measures for each op, following nccl-tests.

For a requested size in bytes, each case builds its buffers once, returns
the nccl-tests ``count`` and bus-bandwidth factor, a coroutine function that
runs one op (timed iterations reuse the same buffers; their values are
neutral so in-place repetition never overflows), and a check that runs one op
on fresh exact data and counts wrong elements on this rank.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..algorithms.table import BY_NAME
from ..communicator import Communicator

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "sendrecv", "pingpong")
ROOTED = tuple(op for op in OPS if op in BY_NAME and BY_NAME[op].rooted)


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' factors (doc/PERFORMANCE.md): the bytes a link must carry per byte of algbw."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in BY_NAME and BY_NAME[op].blockwise:
        return (n - 1) / n
    return 1.0


@dataclass
class Case:
    count: int  # nccl-tests' count column: elements of the whole buffer
    run: Callable[[], Awaitable[object]]
    check: Callable[[], Awaitable[int]]
    legs: int = 1  # one-way messages in series per run: ping-pong reports the one-way time (round trip / 2)


def values(rank: int, count: int, dt: np.dtype, redop: str) -> np.ndarray:
    i = np.arange(count)
    v = 1 + (i + rank) % 2 if redop == "prod" else 1 + (i * 3 + rank * 5) % 7
    return v.astype(dt)


def reduced(n: int, count: int, dt: np.dtype, redop: str) -> np.ndarray:
    stack = np.stack([values(r, count, np.dtype(np.int64), redop) for r in range(n)])
    if redop in ("sum", "avg"):
        red = stack.sum(axis=0)
    elif redop == "prod":
        red = stack.prod(axis=0)
    else:
        red = stack.min(axis=0) if redop == "min" else stack.max(axis=0)
    out: np.ndarray = red.astype(dt)
    if redop == "avg":
        np.divide(out, n, out=out, casting="unsafe")
    return out


def poison(count: int, dt: np.dtype) -> np.ndarray:
    if dt.kind == "f" or dt.name == "bfloat16":
        return np.full(count, np.nan, dt)
    return np.full(count, np.iinfo(dt).max if dt.kind == "u" else -1, dt)


def _wrong(got: np.ndarray, want: np.ndarray) -> int:
    """Elements that differ bit for bit (NaN poison left behind counts as wrong)."""
    if got.size == 0:
        return 0
    g = np.ascontiguousarray(got).reshape(-1).view(np.uint8).reshape(got.size, -1)
    w = np.ascontiguousarray(want).reshape(-1).view(np.uint8).reshape(want.size, -1)
    return int(np.any(g != w, axis=1).sum())


wrong = _wrong  # the public name (tests); inside make() a device-aware wrapper shadows it


def make(comm: Communicator, op: str, nbytes: int, dt: np.dtype, redop: str, root: int,
         in_place: bool, registered: bool = False, device: str = "cpu") -> Case | None:
    """None where the size gives an empty buffer for this op (nccl-tests skips those too).
    ``registered``: buffers from ``comm.alloc`` (zero-copy between same-host ranks);
    ``device="gpu"``: cupy arrays on the current GPU (checked on the host, bit for bit)."""
    n, r = comm.world_size, comm.rank
    cp = _cupy() if device == "gpu" else None

    def alloc(count: int, fill: float | None = None, _dt: np.dtype = dt) -> Any:
        if cp is not None:
            return _filled(cp.empty(count, _dt), fill)
        a = comm.alloc(count, _dt) if registered else np.empty(count, _dt)
        return _filled(a, fill)

    def _filled(a: Any, fill: float | None) -> Any:
        if fill is not None:
            put(a, fill)
        return a

    def put(a: Any, v: Any) -> None:
        if cp is not None:
            a.set(np.broadcast_to(np.asarray(v, dtype=a.dtype), a.shape).copy())
        else:
            a[...] = v

    def wrong(got: Any, want: np.ndarray) -> int:
        return _wrong(cp.asnumpy(got) if cp is not None else got, want)

    total = nbytes // dt.itemsize
    neutral = 1 if redop == "prod" else 0
    if op in BY_NAME and BY_NAME[op].blockwise:
        block = total // n
        if block == 0:
            return None
        total = block * n
    elif total == 0:
        return None

    if op == "all_reduce":
        x, out = alloc(total, neutral), alloc(total)
        dst = None if in_place else out

        async def check() -> int:
            put(x, values(r, total, dt, redop))
            if not in_place:
                put(out, poison(total, dt))
            res = await comm.all_reduce(x, op=redop, out=dst)
            e = wrong(res, reduced(n, total, dt, redop))
            put(x, neutral)
            return e

        return Case(total, lambda: comm.all_reduce(x, op=redop, out=dst), check)

    if op == "broadcast" or op == "reduce":
        x, out = alloc(total, neutral), alloc(total)
        dst = None if in_place else out

        async def check() -> int:
            if op == "broadcast":
                put(x, values(root, total, dt, redop) if r == root else poison(total, dt))
                res = await comm.broadcast(x, root=root, out=dst)
                e = wrong(res, values(root, total, dt, redop))
            else:
                put(x, values(r, total, dt, redop))
                res = await comm.reduce(x, root=root, op=redop, out=dst)
                e = wrong(res, reduced(n, total, dt, redop)) if r == root else 0
            put(x, neutral)
            return e

        if op == "broadcast":
            return Case(total, lambda: comm.broadcast(x, root=root, out=dst), check)
        return Case(total, lambda: comm.reduce(x, root=root, op=redop, out=dst), check)

    if op == "all_gather":
        out = alloc(total, 0)
        x = out[r * block:(r + 1) * block] if in_place else alloc(block, 0)

        async def check() -> int:
            put(out, poison(total, dt))
            put(x, values(r, block, dt, redop))
            res = await comm.all_gather(x, out=out)
            return wrong(res, np.concatenate([values(j, block, dt, redop) for j in range(n)]))

        return Case(total, lambda: comm.all_gather(x, out=out), check)

    if op == "reduce_scatter":
        x, out = alloc(total, neutral), alloc(block)
        dst = None if in_place else out

        async def check() -> int:
            put(x, values(r, total, dt, redop))
            res = await comm.reduce_scatter(x, op=redop, out=dst)
            e = wrong(res, reduced(n, total, dt, redop)[r * block:(r + 1) * block])
            put(x, neutral)
            return e

        return Case(total, lambda: comm.reduce_scatter(x, op=redop, out=dst), check)

    if op == "all_to_all":
        x, out = alloc(total, 0), alloc(total)
        dst = None if in_place else out

        async def check() -> int:
            put(x, (np.arange(total) + 10 * r).astype(np.int64) % 100)
            res = await comm.all_to_all(x, out=dst)
            want = np.concatenate([((np.arange(total) + 10 * j) % 100)[r * block:(r + 1) * block]
                                   for j in range(n)]).astype(dt)
            return wrong(res, want)

        return Case(total, lambda: comm.all_to_all(x, out=dst), check)

    if op == "sendrecv":
        if in_place:
            return None  # receiving into the buffer being sent is a race; nccl-tests' column is meaningless
        x, out = alloc(total, 0), alloc(total)
        right, left = (r + 1) % n, (r - 1) % n

        async def one() -> None:
            recv = comm.irecv(out, left, tag=1)
            await comm.isend(x, right, tag=1)
            await recv

        async def check() -> int:
            put(x, values(r, total, dt, redop))
            put(out, poison(total, dt))
            await one()
            e = wrong(out, values(left, total, dt, redop))
            put(x, 0)
            return e

        return Case(total, one, check)

    if op == "pingpong":  # pairs (0, 1), (2, 3), ...: the even rank sends first; an odd last rank idles
        if in_place:
            return None
        x, out = alloc(total, 0), alloc(total)
        mate = r ^ 1

        async def rally() -> None:
            if mate >= n:
                return
            if r % 2 == 0:
                await comm.isend(x, mate, tag=2)
                await comm.irecv(out, mate, tag=2)
            else:
                await comm.irecv(out, mate, tag=2)
                await comm.isend(x, mate, tag=2)

        async def check_rally() -> int:
            put(x, values(r, total, dt, redop))
            put(out, poison(total, dt))
            await rally()
            e = wrong(out, values(mate, total, dt, redop)) if mate < n else 0
            put(x, 0)
            return e

        return Case(total, rally, check_rally, legs=2)
    raise ValueError(f"unknown op {op!r}")


def _cupy() -> Any:
    from ..gpu.probe import load_cupy

    return load_cupy("aioccl-perf --device gpu")
