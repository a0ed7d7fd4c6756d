"""Rank 1 dies without closing (os._exit); the others must get PeerLost(1) instead of hanging."""

from __future__ import annotations

import asyncio
import os

import numpy as np

import aioccl


async def main() -> None:
    comm = await aioccl.init(timeout=60)
    await comm.barrier()
    if comm.rank == 1:
        os._exit(0)  # a crash: no goodbye, sockets closed by the kernel
    try:
        await comm.all_reduce(np.ones(1000))
        print("no error?!")
    except aioccl.PeerLost as e:
        print(f"PeerLost rank={e.rank}", flush=True)
    comm.abort()


asyncio.run(main())
