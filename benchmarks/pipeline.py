"""A point-to-point pipeline as an application writes it, aioccl against Open MPI (mpi4py), in one session.

    python benchmarks/pipeline.py [--ranks 4] [--sizes 8,64K,1M] [--depth 4] [--repeats 3] [--out docs/bench]

One stage per rank. Stage 0 streams microbatches to stage 1 with non-blocking sends; every later stage keeps
``--depth`` receives posted ahead, adds its rank to each microbatch as it arrives (the "layer"), forwards it
with a non-blocking send, and re-posts a receive into a buffer once that buffer's send is done; the last
stage checks every element. Stage 0 reuses a buffer once its send is done. The same program runs in mpi4py
(``Isend``/``Irecv``, one ``Wait`` per request, the same depth). Numpy float32 buffers, not
``comm.alloc``; data are small integers, exact in float32.

A run's figure is the time of the whole stream between two barriers over the number of microbatches, on
the slowest stage; the table gives the median over repeats and aioccl's time over Open MPI's. Each run is
a fresh set of processes (aioccl under ``aioccl-run`` with its inline engine, Open MPI under ``mpirun``),
in rotating order. Writes ``pipeline.json`` and ``pipeline.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _side_by_side import report, run_workers  # noqa: E402

# microbatches per size: a stream of a few tenths of a second on a 2-core machine. Shorter ones (2000, 500 and 200:
# 25 ms at 64 KiB) timed the scheduler's hiccups more than the stream: the same code gave 73-190 us per 64 KiB
MICROBATCHES = {8: 20000, 64 << 10: 5000, 1 << 20: 1000}


def parse_size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20}.get(s[-1:], 1)
    return int(s[:-1] if mult > 1 else s) * mult


def pattern(count: int) -> np.ndarray:
    """What every microbatch is made from: small integers, exact in float32."""
    return (np.arange(count) % 97).astype(np.float32)


def make(base: np.ndarray, i: int, out: np.ndarray) -> None:
    """Microbatch ``i`` as stage 0 makes it, in one pass."""
    np.add(base, i % 1000, out=out)


def wrong(x: np.ndarray, base: np.ndarray, i: int, n: int, scratch: np.ndarray) -> int:
    """Elements of microbatch ``i`` that differ from what ``n`` stages make of it (each adds its rank)."""
    np.subtract(x, i % 1000 + n * (n - 1) // 2, out=scratch)
    return int(np.count_nonzero(scratch != base))


# -- the program, once for both libraries ---------------------------------------------------------------
def stage(r: int, n: int, count: int, m: int, depth: int, isend, irecv) -> Generator[Any, None, int]:
    """Stage ``r``'s part of one pass of ``m`` microbatches, over ``isend(buf, peer)`` / ``irecv(buf, peer)``;
    it yields each request it must wait for (the library's driver waits) and returns the wrong elements it
    saw (the last stage checks). One program, so both libraries run exactly the same steps."""
    slots = [np.zeros(count, np.float32) for _ in range(depth)]
    base, scratch = pattern(count), np.empty(count, np.float32)
    sends: list = [None] * depth
    bad = 0
    if r == 0:
        for i in range(m):
            k = i % depth
            if sends[k] is not None:
                yield sends[k]
            make(base, i, slots[k])
            sends[k] = isend(slots[k], 1)
    else:
        recvs = [irecv(slots[k], r - 1) if k < m else None for k in range(depth)]
        for i in range(m):
            k = i % depth
            yield recvs[k]
            x = slots[k]
            x += r
            if r + 1 < n:
                sends[k] = isend(x, r + 1)
            else:
                bad += wrong(x, base, i, n, scratch)
            j, nxt = (i - 1) % depth, i - 1 + depth  # the previous buffer takes microbatch i - 1 + depth
            if i >= 1 and nxt < m:
                if sends[j] is not None:
                    yield sends[j]
                    sends[j] = None
                recvs[j] = irecv(slots[j], r - 1)
    for w in sends:
        if w is not None:
            yield w
    return bad


# -- aioccl --------------------------------------------------------------------------------------------
async def aioccl_stream(comm, count: int, m: int, depth: int) -> int:
    """One pass, each request awaited."""
    prog = stage(comm.rank, comm.world_size, count, m, depth, comm.isend, comm.irecv)
    try:
        while True:
            await next(prog)
    except StopIteration as done:
        return done.value


async def aioccl_worker(count: int, m: int, depth: int) -> None:
    import aioccl

    comm = await aioccl.init(timeout=120)
    await aioccl_stream(comm, count, min(m, 4 * depth), depth)  # warm-up: every path taught once
    await comm.barrier()
    t = time.perf_counter()
    bad = await aioccl_stream(comm, count, m, depth)
    await comm.barrier()
    per = (time.perf_counter() - t) / m
    stats = np.array([per, bad], np.float64)
    worst = (await comm.all_reduce(stats.copy(), "max"))[0]
    total_bad = (await comm.all_reduce(stats.copy(), "sum"))[1]
    if comm.rank == 0:
        print(json.dumps({"lib": "aioccl", "us": worst * 1e6, "wrong": int(total_bad)}), flush=True)
    await comm.close()


# -- Open MPI ------------------------------------------------------------------------------------------
def mpi_stream(comm, count: int, m: int, depth: int) -> int:
    """One pass, one ``Wait`` per request."""
    prog = stage(comm.Get_rank(), comm.Get_size(), count, m, depth, comm.Isend, comm.Irecv)
    try:
        while True:
            next(prog).Wait()
    except StopIteration as done:
        return done.value


def mpi_worker(count: int, m: int, depth: int) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    mpi_stream(comm, count, min(m, 4 * depth), depth)
    comm.Barrier()
    t = time.perf_counter()
    bad = mpi_stream(comm, count, m, depth)
    comm.Barrier()
    per = (time.perf_counter() - t) / m
    worst, total_bad = comm.allreduce(per, op=MPI.MAX), comm.allreduce(bad, op=MPI.SUM)
    if comm.Get_rank() == 0:
        print(json.dumps({"lib": "mpi", "us": worst * 1e6, "wrong": total_bad}), flush=True)


# -- the session ---------------------------------------------------------------------------------------
def run_lib(lib: str, n: int, nbytes: int, m: int, depth: int) -> dict:
    got = run_workers(lib, n, __file__, ["--sizes", str(nbytes), "--microbatches", str(m), "--depth", str(depth)],
                      f", {nbytes} B")
    if len(got) != 1 or got[0]["wrong"]:
        raise SystemExit(f"{lib} at {n} ranks, {nbytes} B: wrong or missing result: {got}")
    return got[0]


def fmt(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB" if nbytes >= 1 << 10 else f"{nbytes} B"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--worker", choices=("aioccl", "mpi"))
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--sizes", default="8,64K,1M")
    p.add_argument("--depth", type=int, default=4, help="receives posted ahead (and buffers) per stage, >= 2")
    p.add_argument("--microbatches", type=int, default=0, help="per size (0: the default for the size)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="")
    a = p.parse_args()
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    if a.depth < 2 or a.ranks < 2:
        raise SystemExit("--depth and --ranks must be at least 2 (a buffer is re-posted once the next one arrived)")
    if a.worker:
        count = max(1, sizes[0] // 4)
        m = a.microbatches or MICROBATCHES.get(sizes[0], 200)
        if a.worker == "mpi":
            return mpi_worker(count, m, a.depth)
        return asyncio.run(aioccl_worker(count, m, a.depth))
    if shutil.which("mpirun") is None:
        raise SystemExit("needs Open MPI's mpirun and mpi4py (make bench sets up .venv-bench)")
    points: list[dict] = []
    for rep in range(a.repeats):
        for nbytes in sizes:
            m = a.microbatches or MICROBATCHES.get(nbytes, 200)
            for lib in (("aioccl", "mpi") if rep % 2 == 0 else ("mpi", "aioccl")):
                got = run_lib(lib, a.ranks, nbytes, m, a.depth)
                points.append({**got, "bytes": nbytes, "microbatches": m, "repeat": rep})
                print(f"repeat {rep} {fmt(nbytes)} {lib}: {got['us']:.1f} us per microbatch", flush=True)
    lines = [f"# A {a.ranks}-stage point-to-point pipeline: aioccl vs Open MPI", "",
             f"Median over {a.repeats} repeats of the whole stream's time per microbatch on the slowest stage, "
             f"{a.depth} receives posted ahead per stage, numpy float32; "
             f"`python benchmarks/pipeline.py --ranks {a.ranks} --depth {a.depth}`.", "",
             "| microbatch | microbatches | aioccl us | Open MPI us | aioccl / Open MPI |", "|---|---|---|---|---|"]
    for nbytes in sizes:
        med = {lib: statistics.median(q["us"] for q in points if q["lib"] == lib and q["bytes"] == nbytes)
               for lib in ("aioccl", "mpi")}
        m = a.microbatches or MICROBATCHES.get(nbytes, 200)
        lines.append(f"| {fmt(nbytes)} | {m} | {med['aioccl']:.1f} | {med['mpi']:.1f} | "
                     f"{med['aioccl'] / med['mpi']:.2f}x |")
    report(lines, a.out, "pipeline", {"ranks": a.ranks, "depth": a.depth, "points": points})


if __name__ == "__main__":
    main()
