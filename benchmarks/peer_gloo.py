"""torch.distributed with the Gloo backend, measured like aioccl-perf. Prints one JSON line per point.

    python benchmarks/peer_gloo.py --np 4 --op all_reduce --sizes 8,1048576
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _sweep import sweep, values  # noqa: E402


def worker(rank: int, n: int, port: int, op: str, sizes: list[int], q) -> None:  # noqa: ANN001
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=n)

    def stats(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s, m = torch.from_numpy(v.copy()), torch.from_numpy(v.copy())
        dist.all_reduce(s)
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
        return s.numpy(), m.numpy()

    def setup(inp: int, total: int, block: int) -> tuple[Callable[[], None], Callable[[], int]]:
        if op == "all_reduce":  # in place, gloo's only form
            x = torch.zeros(inp)
            want = sum(values(r, inp) for r in range(n))

            def run() -> None:
                dist.all_reduce(x)

            def check() -> int:
                x.copy_(torch.from_numpy(values(rank, inp)))
                dist.all_reduce(x)
                bad = int((x.numpy() != want).sum())
                x.zero_()
                return bad
            return run, check
        elif op == "broadcast":
            x = torch.zeros(inp)

            def run() -> None:
                dist.broadcast(x, 0)

            def check() -> int:
                x.copy_(torch.from_numpy(values(0, inp) if rank == 0 else np.full(inp, -1, np.float32)))
                dist.broadcast(x, 0)
                return int((x.numpy() != values(0, inp)).sum())
            return run, check
        elif op == "pingpong":  # pairs (0, 1), (2, 3), ...: the even rank sends first
            x, out, mate = torch.zeros(inp), torch.zeros(inp), rank ^ 1

            def run() -> None:
                if mate >= n:
                    return
                if rank % 2 == 0:
                    dist.send(x, mate)
                    dist.recv(out, mate)
                else:
                    dist.recv(out, mate)
                    dist.send(x, mate)

            def check() -> int:
                x.copy_(torch.from_numpy(values(rank, inp)))
                out.fill_(-1)
                run()
                return int((out.numpy() != values(mate, inp)).sum()) if mate < n else 0
            return run, check
        elif op == "all_gather":
            x, out = torch.zeros(inp), torch.zeros(total)

            def run() -> None:
                dist.all_gather_into_tensor(out, x)

            def check() -> int:
                x.copy_(torch.from_numpy(values(rank, inp)))
                dist.all_gather_into_tensor(out, x)
                return int((out.numpy() != np.concatenate([values(r, inp) for r in range(n)])).sum())
            return run, check
        else:  # reduce_scatter
            x, out = torch.zeros(inp), torch.zeros(block)
            want = sum(values(r, inp) for r in range(n))[rank * block:(rank + 1) * block]

            def run() -> None:
                dist.reduce_scatter_tensor(out, x)

            def check() -> int:
                x.copy_(torch.from_numpy(values(rank, inp)))
                dist.reduce_scatter_tensor(out, x)
                return int((out.numpy() != want).sum())
            return run, check

    for point in sweep("gloo", op, n, sizes, setup, dist.barrier, stats):
        if rank == 0:
            q.put(point)
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    p = argparse.ArgumentParser()
    p.add_argument("--np", type=int, required=True)
    p.add_argument("--op", required=True)
    p.add_argument("--sizes", required=True)
    p.add_argument("--port", type=int, default=0, help="torch's store port (default: one reserved for the run)")
    a = p.parse_args()
    from aioccl.bootstrap.ports import reserve

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    sizes = [int(s) for s in a.sizes.split(",")]
    with reserve("127.0.0.1", a.port) as port:  # held while the ranks run: nothing else can take it
        mp.start_processes(worker, args=(a.np, port.port, a.op, sizes, q), nprocs=a.np, join=True,
                           start_method="spawn")
    while not q.empty():
        print(json.dumps(q.get()), flush=True)


if __name__ == "__main__":
    main()
