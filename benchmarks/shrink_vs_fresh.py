"""A shrunk communicator against a fresh one of its size: all_reduce time, in one run.

    .venv/bin/aioccl-run --keep-going --nproc-per-node 4 --no-prefix benchmarks/shrink_vs_fresh.py

Rank 3 exits abruptly; the three survivors see ``PeerLost``, ``shrink()``, then create a fresh
3-rank communicator (a new unique id sent over the shrunk one) and time back-to-back in-place float32
all_reduces on both, alternating, median of 3 loops each. The new rank 0 prints one line per size.
"""

from __future__ import annotations

import asyncio
import os
import statistics

import numpy as np
from split_vs_world import SIZES, loop_time

import aioccl


async def main() -> None:
    comm = await aioccl.init(timeout=60)
    await comm.barrier()
    if comm.rank == comm.world_size - 1:
        os._exit(0)  # gone without a goodbye, like a crash
    try:
        await comm.all_reduce(np.ones(1, np.float32))
    except aioccl.PeerLost:
        pass
    shrunk = await comm.shrink()
    uid = np.zeros(256, np.uint8)
    if shrunk.rank == 0:
        text = str(aioccl.UniqueId.new()).encode()
        uid[:len(text)] = np.frombuffer(text, np.uint8)
    await shrunk.broadcast(uid, root=0)
    fresh = await aioccl.Communicator.create(bytes(uid).rstrip(b"\0").decode(), shrunk.rank, shrunk.world_size)
    lines = []
    for nbytes, iters in SIZES:
        times: dict[str, list[float]] = {"shrunk": [], "fresh": []}
        for _ in range(3):
            times["shrunk"].append(await loop_time(shrunk, nbytes, iters))
            times["fresh"].append(await loop_time(fresh, nbytes, iters))
        ms, mf = statistics.median(times["shrunk"]), statistics.median(times["fresh"])
        lines.append(f"{nbytes} B, {shrunk.world_size} ranks: shrunk {ms * 1e6:.0f} us ({shrunk.transport}), "
                     f"fresh {mf * 1e6:.0f} us ({fresh.transport}): {ms / mf:.2f}x")
    if shrunk.rank == 0:
        print("\n".join(lines), flush=True)
    await fresh.close()
    await shrunk.close()


asyncio.run(main())
