"""Rank 1 fails; the others would wait a long time in a barrier."""

import asyncio
import sys

import aioccl


async def main() -> None:
    comm = await aioccl.init(timeout=600)
    if comm.rank == 1:
        sys.exit(3)
    await asyncio.sleep(600)


asyncio.run(main())
