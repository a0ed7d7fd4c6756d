"""The smallest aioccl program.

    aioccl-run --nproc-per-node 4 examples/hello_allreduce.py
"""

import asyncio

import numpy as np

import aioccl


async def main() -> None:
    async with await aioccl.init() as comm:
        x = np.full(4, comm.rank + 1, dtype=np.float32)
        await comm.all_reduce(x)  # in place: every rank now holds 1 + 2 + ... + n
        print(f"rank {comm.rank}/{comm.world_size}: {x}")


asyncio.run(main())
