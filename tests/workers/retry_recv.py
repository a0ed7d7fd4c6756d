"""The receive-retry loop every asyncio user writes, against a sender at random gaps: no message lost.

    while True:
        try:
            await asyncio.wait_for(comm.irecv(buf, 0, tag=3), timeout)   # (anyio: move_on_after; trio too)
            break
        except TimeoutError:
            pass

Rank 0 sends numbered messages (8 B, 64 KiB, and past AIOCCL_P2P_EAGER: a rendezvous) with random gaps of
0-2 ms; rank 1 receives each with the loop above and random timeouts of 0.2-3 ms, poisoning its buffer before
every try. Every message must arrive exactly once, in order, every element exact.

Run as: aioccl-run --nproc-per-node 2 tests/workers/retry_recv.py LIB SMALL MEDIUM LARGE [SEED]
(LIB: asyncio, anyio or trio; the three counts: messages of each size.) Prints RETRY ok rank R gave-up G.
"""

from __future__ import annotations

import random
import sys

import numpy as np

import aioccl

LIB = sys.argv[1]
COUNTS = [int(a) for a in sys.argv[2:5]]
SEED = int(sys.argv[5]) if len(sys.argv) > 5 else random.randrange(1 << 30)
SIZES = (2, 16384, (1 << 20) // 4 + 1024)  # int32 elements: 8 B, 64 KiB, 1 MiB + 4 KiB (a rendezvous)


def message(k: int, count: int) -> np.ndarray:
    return ((np.arange(count) + 7 * k) % 1009).astype(np.int32)


if LIB in ("trio", "anyio"):  # (the same calls in both: a cancel scope, then the library's run)
    import importlib

    lib = importlib.import_module(LIB)
    sleep = lib.sleep

    async def within(seconds: float, work: aioccl.Work) -> bool:
        with lib.move_on_after(seconds):
            await work
            return True
        return False

    def run(main: object) -> None:
        lib.run(main)
else:
    import asyncio

    sleep = asyncio.sleep

    async def within(seconds: float, work: aioccl.Work) -> bool:
        try:
            await asyncio.wait_for(work, seconds)  # (asyncio.wait_for wraps the awaitable in a task)
            return True
        except TimeoutError:
            return False

    def run(main: object) -> None:
        asyncio.run(main())  # type: ignore[operator]


async def main() -> None:
    comm = await aioccl.init(timeout=120)
    rng = random.Random(SEED + comm.rank)
    gave_up = 0
    for size_no, (count, total) in enumerate(zip(SIZES, COUNTS, strict=True)):
        tag = 3 + size_no
        if comm.rank == 0:
            for k in range(total):
                await sleep(rng.uniform(0, 0.002))
                await comm.isend(message(k, count), 1, tag=tag)
        elif comm.rank == 1:
            buf = np.empty(count, np.int32)
            for k in range(total):
                while True:
                    buf.fill(-1)  # (poisoned before every try)
                    if await within(rng.uniform(0.0002, 0.003), comm.irecv(buf, 0, tag=tag)):
                        break
                    gave_up += 1
                want = message(k, count)
                if not np.array_equal(buf, want):
                    got = int(buf[0]) * pow(7, -1, 1009) % 1009 if buf[0] >= 0 else "poison"  # (its number)
                    raise SystemExit(f"seed {SEED}: size {count * 4} B: message {k} expected, got {got} "
                                     f"(first elements {buf[:4]}, after {gave_up} tries given up)")
        await comm.barrier()
    await comm.close()
    print(f"RETRY ok rank {comm.rank} gave-up {gave_up} seed {SEED}", flush=True)


run(main)
