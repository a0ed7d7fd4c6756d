"""Is memory flat over many ops? RSS and the engine's pool after warm-up and after N more ops.

    aioccl-run --nproc-per-node 2 benchmarks/memory_flat.py [--ops 10000] [--size 65536]
"""

from __future__ import annotations

import argparse
import asyncio

import numpy as np

import aioccl


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ops", type=int, default=10000)
    p.add_argument("--size", type=int, default=65536, help="bytes per op (float32)")
    a = p.parse_args()
    comm = await aioccl.init()
    x = np.zeros(a.size // 4, np.float32)
    out = np.empty_like(x)
    for i in range(200):  # warm-up with the same op mix: pools, caches and shared pages fill here
        await (comm.all_reduce(x, out=out) if i % 2 else comm.broadcast(x, root=i % comm.world_size))
    before, pool_before = rss_kib(), comm._engine.pool.allocated_bytes
    for i in range(a.ops):
        await (comm.all_reduce(x, out=out) if i % 2 else comm.broadcast(x, root=i % comm.world_size))
    after, pool_after = rss_kib(), comm._engine.pool.allocated_bytes
    print(f"rank {comm.rank}: {a.ops} ops of {a.size} B: RSS {before} -> {after} KiB ({after - before:+d}), "
          f"pool {pool_before} -> {pool_after} B", flush=True)
    await comm.close()


asyncio.run(main())
