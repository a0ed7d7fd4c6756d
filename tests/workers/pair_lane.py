"""Two ranks stream messages of every size both ways at once, each checked exactly and in order
(tests/test_pair_lane.py); prints ``PAIRLANE OK <sent> <received>`` (the lane's counts)."""

from __future__ import annotations

import asyncio

import numpy as np

import aioccl

SIZES = [0, 1, 3, 8, 100, 1000, 1012, 1013, 4000, 4047, 4048, 5000, 16 << 10, 70 << 10, 300_001]


def msg(i: int, n: int, src: int) -> np.ndarray:
    return ((np.arange(n) + 31 * i + src) % 251).astype(np.uint8)


async def main() -> None:
    comm = await aioccl.init()
    me, peer = comm.rank, 1 - comm.rank
    assert comm._pair.native is not None

    async def send_all() -> None:
        for i in range(600):
            n = SIZES[i % len(SIZES)]
            await comm.isend(msg(i, n, me), peer, i % 3)

    async def recv_all() -> None:
        for i in range(600):
            n = SIZES[i % len(SIZES)]
            y = np.full(n, 7, np.uint8)
            await comm.irecv(y, peer, i % 3)
            assert np.array_equal(y, msg(i, n, peer)), (i, n, y[:8], msg(i, n, peer)[:8])

    await asyncio.gather(send_all(), recv_all())
    await comm.barrier()
    s = comm._pair.native.stats()
    print(f"PAIRLANE OK {s['sent']} {s['received']}", flush=True)
    await comm.close()


asyncio.run(main())
