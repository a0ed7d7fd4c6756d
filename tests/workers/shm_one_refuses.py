"""Rank 1 alone sets AIOCCL_SHM_DISABLE: no shared-memory channel for anyone, pairs without rank 1 on shm."""

from __future__ import annotations

import asyncio
import os

import numpy as np

if os.environ.get("AIOCCL_RANK") == "1":
    os.environ["AIOCCL_SHM_DISABLE"] = "1"

import aioccl  # noqa: E402


async def main() -> None:
    comm = await aioccl.init(timeout=60)
    x = np.full(3, comm.rank + 1.0)
    await comm.all_reduce(x)
    n = comm.world_size
    to = " ".join(f"{p}:{comm.transport_to(p)}" for p in range(n))
    print(f"rank {comm.rank} transport {comm.transport} to {to} ok {bool((x == n * (n + 1) / 2).all())}", flush=True)
    await comm.close()


asyncio.run(main())
