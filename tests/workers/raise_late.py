"""Rank 2 raises while the others wait on it; they fail a moment later (PeerLost) and exit quickly."""

import asyncio

import numpy as np

import aioccl


async def main() -> None:
    comm = await aioccl.init(timeout=60)
    await comm.barrier()
    if comm.rank == 2:
        await asyncio.sleep(0.2)
        raise ValueError("boom at rank 2")
    await comm.all_reduce(np.ones(10), timeout=60)


asyncio.run(main())
