"""Every collective at a small size, aioccl against Open MPI (mpi4py), side by side in one session.

    python benchmarks/small_ops.py [--ranks 2,4] [--bytes 64] [--repeats 3] [--iters 2000] [--out docs/bench]

Per repeat and rank count, each library runs every op in fresh processes (aioccl under ``aioccl-run`` with
its inline engine, each op awaited; Open MPI under ``mpirun``), in rotating order. Per op: one call on exact
data checked element by element, a warm-up, a barrier, then ``--iters`` calls back to back, each timed; a
run's figure is the median per-call time of the slowest rank (as ``_sweep.py`` and nccl-tests time them).
The table gives the median over repeats and aioccl's time over Open MPI's. Sizes follow nccl-tests: the
whole buffer is ``--bytes`` of float32; block-wise ops move ``bytes / ranks`` per rank. Writes
``small_ops.json`` and ``small_ops.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _side_by_side import report, run_workers  # noqa: E402

OPS = ("all_reduce", "all_reduce_out", "broadcast", "all_gather", "reduce_scatter", "reduce", "gather", "scatter",
       "all_to_all", "scan", "barrier")
NAMES = {"all_reduce": "all_reduce (in place)", "all_reduce_out": "all_reduce(x, out=y)",
         "all_gather": "all_gather(x, out=y)", "reduce_scatter": "reduce_scatter(x, out=y)",
         "reduce": "reduce (root 0, out=y)", "gather": "gather (root 0)", "scatter": "scatter (root 0)",
         "all_to_all": "all_to_all(x, out=y)", "scan": "scan(x, out=y)", "broadcast": "broadcast (root 0)",
         "barrier": "barrier"}
MPI_NAMES = {"all_reduce": "Allreduce(IN_PLACE)", "all_reduce_out": "Allreduce", "broadcast": "Bcast",
             "all_gather": "Allgather", "reduce_scatter": "Reduce_scatter_block", "reduce": "Reduce",
             "gather": "Gather", "scatter": "Scatter", "all_to_all": "Alltoall", "scan": "Scan", "barrier": "Barrier"}


def data(rank: int, count: int) -> np.ndarray:
    return ((np.arange(count) * 3 + rank * 5) % 7 + 1).astype(np.float32)


def expected(op: str, rank: int, n: int, total: int) -> np.ndarray | None:
    """What ``op`` leaves in this rank's output when rank j's input is ``data(j, ...)``."""
    b = total // n
    if op in ("all_reduce", "all_reduce_out"):
        return sum(data(j, total) for j in range(n))
    if op == "reduce":
        return sum(data(j, total) for j in range(n)) if rank == 0 else None
    if op == "scan":
        return sum(data(j, total) for j in range(rank + 1))
    if op == "broadcast":
        return data(0, total)
    if op == "all_gather":
        return np.concatenate([data(j, b) for j in range(n)])
    if op == "gather":
        return np.concatenate([data(j, b) for j in range(n)]) if rank == 0 else None
    if op == "reduce_scatter":
        return sum(data(j, total) for j in range(n))[rank * b:(rank + 1) * b]
    if op == "scatter":
        return data(0, total)[rank * b:(rank + 1) * b]
    if op == "all_to_all":
        return np.concatenate([data(j, total)[rank * b:(rank + 1) * b] for j in range(n)])
    return None


def buffers(op: str, rank: int, n: int, total: int) -> tuple[np.ndarray, np.ndarray]:
    """(input, output) on exact data, the output poisoned."""
    b = total // n
    small = op in ("all_gather", "gather")
    x = data(rank, b if small else total)
    out_len = b if op in ("reduce_scatter", "scatter") else total
    return x, np.full(out_len, -1.0, np.float32)


def timed(run, iters: int) -> float:
    for _ in range(max(2, iters // 10)):
        run()
    per = []
    for _ in range(iters):
        t = time.perf_counter()
        run()
        per.append(time.perf_counter() - t)
    return float(np.median(per))


def mpi_call(MPI, comm, op: str, x: np.ndarray, y: np.ndarray):  # noqa: N803 (the module's own name)
    """One call of ``op`` on x and y through mpi4py."""
    return {
        "all_reduce": lambda: comm.Allreduce(MPI.IN_PLACE, y, op=MPI.SUM),
        "all_reduce_out": lambda: comm.Allreduce(x, y, op=MPI.SUM),
        "broadcast": lambda: comm.Bcast(y, root=0),
        "all_gather": lambda: comm.Allgather(x, y),
        "reduce_scatter": lambda: comm.Reduce_scatter_block(x, y, op=MPI.SUM),
        "reduce": lambda: comm.Reduce(x, y, op=MPI.SUM, root=0),
        "gather": lambda: comm.Gather(x, y, root=0),
        "scatter": lambda: comm.Scatter(x, y, root=0),
        "all_to_all": lambda: comm.Alltoall(x, y),
        "scan": lambda: comm.Scan(x, y, op=MPI.SUM),
        "barrier": comm.Barrier,
    }[op]


def aioccl_call(comm, op: str, x: np.ndarray, y: np.ndarray):
    """One call of ``op`` on x and y through aioccl (a Work to await)."""
    r = comm.rank
    return {
        "all_reduce": lambda: comm.all_reduce(y),
        "all_reduce_out": lambda: comm.all_reduce(x, out=y),
        "broadcast": lambda: comm.broadcast(y, root=0),
        "all_gather": lambda: comm.all_gather(x, out=y),
        "reduce_scatter": lambda: comm.reduce_scatter(x, out=y),
        "reduce": lambda: comm.reduce(x, root=0, out=y),
        "gather": lambda: comm.gather(x, root=0, out=y),
        "scatter": lambda: comm.scatter(x if r == 0 else None, root=0, out=y),
        "all_to_all": lambda: comm.all_to_all(x, out=y),
        "scan": lambda: comm.scan(x, out=y),
        "barrier": comm.barrier,
    }[op]


# -- the workers ------------------------------------------------------------------------------------------
def mpi_worker(ops: list[str], total: int, iters: int) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    r, n = comm.Get_rank(), comm.Get_size()
    for op in ops:
        x, y = buffers(op, r, n, total)
        call = mpi_call(MPI, comm, op, x, y)
        if op == "all_reduce":
            y[...] = x
        if op == "broadcast":
            y[...] = x if r == 0 else -1
        call()
        want = expected(op, r, n, total)
        bad = 0 if want is None else int((y != want).sum())
        if op in ("all_reduce", "broadcast"):
            y[...] = 0  # neutral for the timed repetitions
        comm.Barrier()
        t = timed(call, iters)
        worst, wrong = comm.allreduce(t, op=MPI.MAX), comm.allreduce(bad, op=MPI.SUM)
        if r == 0:
            print(json.dumps({"lib": "mpi", "op": op, "ranks": n, "us": worst * 1e6, "wrong": wrong}), flush=True)


async def aioccl_worker(ops: list[str], total: int, iters: int) -> None:
    import aioccl

    comm = await aioccl.init(timeout=60)
    r, n = comm.rank, comm.world_size
    loop_iters = iters
    for op in ops:
        x, y = buffers(op, r, n, total)
        call = aioccl_call(comm, op, x, y)
        if op == "all_reduce":
            y[...] = x
        if op == "broadcast":
            y[...] = x if r == 0 else -1
        await call()
        want = expected(op, r, n, total)
        bad = 0 if want is None else int((y != want).sum())
        if op in ("all_reduce", "broadcast"):
            y[...] = 0
        await comm.barrier()
        for _ in range(max(2, loop_iters // 10)):
            await call()
        per = []
        for _ in range(loop_iters):
            t = time.perf_counter()
            await call()
            per.append(time.perf_counter() - t)
        stats = np.array([float(np.median(per)), bad], np.float64)
        worst = (await comm.all_reduce(stats.copy(), "max"))[0]
        wrong = (await comm.all_reduce(stats.copy(), "sum"))[1]
        if r == 0:
            print(json.dumps({"lib": "aioccl", "op": op, "ranks": n, "us": worst * 1e6, "wrong": int(wrong)}),
                  flush=True)
    await comm.close()


# -- the session ----------------------------------------------------------------------------------------
def run_lib(lib: str, n: int, total_bytes: int, iters: int) -> list[dict]:
    return run_workers(lib, n, __file__, ["--bytes", str(total_bytes), "--iters", str(iters)], "")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--worker", choices=("aioccl", "mpi"))
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--bytes", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--out", default="")
    a = p.parse_args()
    ops = a.ops.split(",")
    total = a.bytes // 4
    if a.worker == "mpi":
        return mpi_worker(ops, total, a.iters)
    if a.worker == "aioccl":
        return asyncio.run(aioccl_worker(ops, total, a.iters))
    if shutil.which("mpirun") is None:
        raise SystemExit("needs Open MPI's mpirun and mpi4py (make bench sets up .venv-bench)")
    ranks = [int(x) for x in a.ranks.split(",")]
    points: list[dict] = []
    for rep in range(a.repeats):
        for n in ranks:
            libs = ("aioccl", "mpi") if rep % 2 == 0 else ("mpi", "aioccl")
            for lib in libs:
                got = run_lib(lib, n, a.bytes, a.iters)
                bad = [g for g in got if g["wrong"]]
                if bad:
                    raise SystemExit(f"wrong results: {bad}")
                points += [{**g, "repeat": rep} for g in got]
                print(f"repeat {rep} {lib} {n} ranks: " + ", ".join(f"{g['op']} {g['us']:.1f}" for g in got),
                      flush=True)
    lines = [f"# Every collective at {a.bytes} B: aioccl vs Open MPI", "",
             f"Median over {a.repeats} repeats of the slowest rank's median per-call time ({a.iters} calls back "
             f"to back), float32, one host; `python benchmarks/small_ops.py --bytes {a.bytes}`.", ""]
    head = "| op | MPI call | " + " | ".join(f"{n} ranks: aioccl / MPI us (ratio)" for n in ranks) + " |"
    lines += [head, "|" + "---|" * (2 + len(ranks))]
    for op in ops:
        cells = []
        for n in ranks:
            med = {lib: statistics.median(q["us"] for q in points if q["lib"] == lib and q["op"] == op
                                          and q["ranks"] == n) for lib in ("aioccl", "mpi")}
            cells.append(f"{med['aioccl']:.1f} / {med['mpi']:.1f} ({med['aioccl'] / med['mpi']:.2f}x)")
        lines.append(f"| {NAMES[op]} | {MPI_NAMES[op]} | " + " | ".join(cells) + " |")
    report(lines, a.out, "small_ops", {"bytes": a.bytes, "points": points})


if __name__ == "__main__":
    main()
