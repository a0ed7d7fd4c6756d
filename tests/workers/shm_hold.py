"""Join the communicator over shared memory, run a collective, say "ready", then hang until killed."""

from __future__ import annotations

import asyncio
import os

import numpy as np

import aioccl


async def main() -> None:
    comm = await aioccl.init(timeout=60)
    x = comm.alloc(1 << 16, np.float32)  # touch the heap as well as the slots
    x[...] = 1
    await comm.all_reduce(x)
    assert comm.transport == "shm" and (x == comm.world_size).all()
    print(f"ready pid={os.getpid()}", flush=True)
    await asyncio.sleep(120)


asyncio.run(main())
