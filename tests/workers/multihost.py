"""Run on two "hosts" (network namespaces): ranks on each host see each other as local."""

from __future__ import annotations

import asyncio
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import aioccl  # noqa: E402
from aioccl.tuning import Tuning  # noqa: E402

from _check import Checker  # noqa: E402


async def main() -> None:
    comm = await aioccl.init(timeout=60)
    ck = Checker(comm.rank)
    n, r = comm.world_size, comm.rank
    per_node = int(os.environ["AIOCCL_LOCAL_WORLD_SIZE"])
    ck.true(f"local rank {comm.local_rank}/{comm.local_world_size}",
            comm.local_world_size == per_node and comm.local_rank == r % per_node)
    for count in (7, 300_000, 4_000_000):  # latency, then bandwidth algorithms (the tuner's choice)
        x = ((np.arange(count) % 5) + r).astype(np.float32)
        await comm.all_reduce(x)
        ck.same(f"all_reduce {count}", x, (n * (np.arange(count) % 5) + n * (n - 1) // 2).astype(np.float32))
    used = sorted({s.algo for s, _native in comm._planner.plans.values()})
    ck.true(f"the hierarchy ran across hosts: {used}", "rail" in used)
    for algo in ("rail", "leader", "ring"):  # forced, so each runs across real hosts whatever the tuner says
        gathers = "leader" if algo == "leader" else "rail"
        comm._planner.tuning = Tuning(comm._planner.tuning.buffsize, (("all_reduce", algo), ("reduce", "leader"),
                                                      ("broadcast", "leader"), ("all_gather", gathers),
                                                      ("reduce_scatter", gathers)))
        comm._planner.forget()
        x = ((np.arange(300_001) % 5) + r).astype(np.float32)
        await comm.all_reduce(x)
        ck.same(f"all_reduce {algo}", x, (n * (np.arange(300_001) % 5) + n * (n - 1) // 2).astype(np.float32))
        g = await comm.all_gather(np.full(10_001, r, np.int32))
        ck.same(f"all_gather {gathers}", g, np.repeat(np.arange(n, dtype=np.int32), 10_001))
        rs = await comm.reduce_scatter(np.tile(np.arange(n * 5, dtype=np.float64), 1) + r, out=np.full(5, -1.0))
        ck.same(f"reduce_scatter {gathers}", rs, n * np.arange(5 * r, 5 * r + 5, dtype=np.float64) + n * (n - 1) / 2)
        for root in range(n):
            y = np.full(1001, r + 1, np.int64)
            out = np.full(1001, -1, np.int64)
            await comm.reduce(y, root=root, out=out)
            ck.same(f"reduce leader root {root}", out, np.full(1001, n * (n + 1) // 2 if r == root else -1))
            z = np.arange(999, dtype=np.int32) if r == root else np.zeros(999, np.int32)
            await comm.broadcast(z, root=root)
            ck.same(f"broadcast leader root {root}", z, np.arange(999, dtype=np.int32))
    comm._planner.tuning = Tuning()
    comm._planner.forget()
    g = await comm.all_gather(np.array([r, 10 * r], np.int64))
    ck.same("all_gather", g, np.stack([np.arange(n), 10 * np.arange(n)], 1).reshape(-1))
    b = np.arange(50_000, dtype=np.float64) if r == n - 1 else np.zeros(50_000)
    await comm.broadcast(b, root=n - 1)
    ck.same("broadcast", b, np.arange(50_000, dtype=np.float64))
    peer = (r + per_node) % n  # the same local rank on the other host
    got = np.zeros(1000, np.int32)
    recv = comm.irecv(got, peer, tag=3)
    await comm.isend(np.full(1000, r, np.int32), peer, tag=3)
    await recv
    ck.same("p2p across hosts", got, np.full(1000, peer, np.int32))
    host = r // per_node
    neighbour = host * per_node + (comm.local_rank + 1) % per_node
    ck.true(f"pairs: {comm.transport}", comm.transport == "shm+tcp" and comm.transport_to(neighbour) == "shm"
            and comm.transport_to(peer) == "tcp")
    mine = await comm.split(host)  # the ranks of this host: a shared-memory channel of their own
    rail = await comm.split(comm.local_rank)  # one rank per host: over the network
    ck.true(f"per-host child over {mine.transport}", mine.transport == "shm" and mine._state.shm is not None)
    ck.true(f"per-rail child over {rail.transport}", rail.transport == "tcp" and rail._state.shm is None)
    for child in (mine, rail):
        y = np.full(200_000, r + 1, np.int64)
        await child.all_reduce(y)
        members = [host * per_node + j for j in range(per_node)] if child is mine else \
            [h * per_node + comm.local_rank for h in range(n // per_node)]
        ck.same(f"child all_reduce over {child.transport}", y, np.full(200_000, sum(m + 1 for m in members)))
    await rail.close()
    await mine.close()
    await comm.close()
    ck.finish(f"multihost rank {r} on host {os.environ.get('AIOCCL_NODE')}")


asyncio.run(main())
