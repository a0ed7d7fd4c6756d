"""aioccl.init() from whatever launcher environment the test set up; prints what it saw."""

import asyncio

import numpy as np

import aioccl


async def main() -> None:
    comm = await aioccl.init(timeout=30)
    x = np.full(3, comm.rank + 1, np.int64)
    await comm.all_reduce(x)
    print(f"rank={comm.rank} size={comm.world_size} local={comm.local_rank} sum={int(x[0])}", flush=True)
    await comm.close()


asyncio.run(main())
