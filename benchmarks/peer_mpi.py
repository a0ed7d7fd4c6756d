"""Open MPI through mpi4py, measured like aioccl-perf. Run under mpirun; rank 0 prints JSON lines.

    mpirun --allow-run-as-root --oversubscribe -np 4 python benchmarks/peer_mpi.py --op all_reduce --sizes 8,1048576
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(__file__))
from _sweep import sweep, values  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--op", required=True)
    p.add_argument("--sizes", required=True)
    a = p.parse_args()
    comm = MPI.COMM_WORLD
    rank, n, op = comm.Get_rank(), comm.Get_size(), a.op

    def stats(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s, m = np.empty_like(v), np.empty_like(v)
        comm.Allreduce(v, s, op=MPI.SUM)
        comm.Allreduce(v, m, op=MPI.MAX)
        return s, m

    def setup(inp: int, total: int, block: int) -> tuple[Callable[[], None], Callable[[], int]]:
        if op == "all_reduce":  # in place, like the gloo and aioccl runs
            x = np.zeros(inp, np.float32)
            want = sum(values(r, inp) for r in range(n))

            def run() -> None:
                comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)

            def check() -> int:
                x[...] = values(rank, inp)
                run()
                bad = int((x != want).sum())
                x[...] = 0
                return bad
            return run, check
        elif op == "broadcast":
            x = np.zeros(inp, np.float32)

            def run() -> None:
                comm.Bcast(x, root=0)

            def check() -> int:
                x[...] = values(0, inp) if rank == 0 else -1
                run()
                return int((x != values(0, inp)).sum())
            return run, check
        elif op == "pingpong":  # pairs (0, 1), (2, 3), ...: the even rank sends first
            x, out, mate = np.full(inp, rank, np.float32), np.zeros(inp, np.float32), rank ^ 1

            def run() -> None:
                if mate >= n:
                    return
                if rank % 2 == 0:
                    comm.Send(x, dest=mate, tag=2)
                    comm.Recv(out, source=mate, tag=2)
                else:
                    comm.Recv(out, source=mate, tag=2)
                    comm.Send(x, dest=mate, tag=2)

            def check() -> int:
                x[...] = values(rank, inp)
                out[...] = -1
                run()
                return int((out != values(mate, inp)).sum()) if mate < n else 0
            return run, check
        elif op == "all_gather":
            x, out = np.zeros(inp, np.float32), np.zeros(total, np.float32)

            def run() -> None:
                comm.Allgather(x, out)

            def check() -> int:
                x[...] = values(rank, inp)
                run()
                return int((out != np.concatenate([values(r, inp) for r in range(n)])).sum())
            return run, check
        else:
            x, out = np.zeros(inp, np.float32), np.zeros(block, np.float32)
            want = sum(values(r, inp) for r in range(n))[rank * block:(rank + 1) * block]

            def run() -> None:
                comm.Reduce_scatter_block(x, out, op=MPI.SUM)

            def check() -> int:
                x[...] = values(rank, inp)
                run()
                return int((out != want).sum())
            return run, check

    sizes = [int(s) for s in a.sizes.split(",")]
    for point in sweep("mpi", op, n, sizes, setup, comm.Barrier, stats):
        if rank == 0:
            print(json.dumps(point), flush=True)

if __name__ == "__main__":
    main()
