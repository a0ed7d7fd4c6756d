"""aioccl under anyio, on asyncio or trio: a ring exchange and an all_reduce from task-group children.

    aioccl-run --nproc-per-node 3 examples/anyio_pipeline.py [--backend trio] [--rounds 20]

Each round every rank sends a block to its right neighbour and receives one
from its left, in two sibling tasks, then all ranks sum what they received.
Under asyncio the engine runs inline on the loop; under trio it runs on a
proxy thread and each ``await`` parks the trio task until the op is done.
A cancel scope bounds the whole run: a lost rank cannot hang it.
"""

from __future__ import annotations

import argparse
from typing import Any

import anyio
import numpy as np

import aioccl


async def awaited(work: aioccl.Work[Any]) -> None:
    await work  # task groups start coroutine functions; a Work is an awaitable


async def main(rounds: int) -> None:
    async with await aioccl.init(timeout=60) as comm:
        n, r = comm.world_size, comm.rank
        left, right = (r - 1) % n, (r + 1) % n
        block = np.empty(1000, dtype=np.int64)
        total = np.zeros(1000, dtype=np.int64)
        with anyio.fail_after(60):
            for k in range(rounds):
                mine = np.arange(1000, dtype=np.int64) + 1000 * r + k
                async with anyio.create_task_group() as tg:
                    tg.start_soon(awaited, comm.irecv(block, left))
                    tg.start_soon(awaited, comm.isend(mine, right))
                assert block[0] == 1000 * left + k, (k, block[0])
                total += await comm.all_reduce(block.copy())
        # every block of every rank was summed once per round
        want = sum(np.arange(1000, dtype=np.int64) * n + 1000 * sum(range(n)) + n * k for k in range(rounds))
        assert np.array_equal(total, want)
        if r == 0:
            print(f"{n} ranks, {rounds} rounds under {comm.engine_placement} engine: all results checked")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    ap.add_argument("--rounds", type=int, default=20)
    ns = ap.parse_args()
    anyio.run(main, ns.rounds, backend=ns.backend)
