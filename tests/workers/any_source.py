"""Receives from any source and with any tag in real processes: order, status, large messages, errors.

argv[1]: the elements per large message (over AIOCCL_P2P_EAGER it goes by rendezvous, read in place
between same-host ranks with cross-memory attach).
"""

from __future__ import annotations

import asyncio
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import aioccl  # noqa: E402
from aioccl import ANY_SOURCE, ANY_TAG  # noqa: E402

from _check import Checker  # noqa: E402

K = 5  # messages from each sender


async def main() -> None:
    comm = await aioccl.init(timeout=60)
    ck = Checker(comm.rank)
    n, r = comm.world_size, comm.rank
    big = int(sys.argv[1]) if len(sys.argv) > 1 else 1000

    # every rank sends K numbered messages (tag = its number) to rank 0, which takes them from any source
    if r == 0:
        seen: dict[int, list[int]] = {s: [] for s in range(1, n)}
        for _ in range((n - 1) * K):
            buf = np.full(3, -1, np.int64)
            w = comm.irecv(buf, ANY_SOURCE, ANY_TAG)
            await w
            src, tag = w.status
            ck.same(f"message {tag} from {src}", buf, np.array([src, tag, src * 100 + tag]))
            seen[src].append(tag)
        ck.true(f"each sender's messages in the order sent: {seen}", all(v == list(range(K)) for v in seen.values()))
    else:
        for i in range(K):
            await comm.isend(np.array([r, i, r * 100 + i], np.int64), 0, tag=i)
    await comm.barrier()

    # a receive posted before a wildcard one gets the first message; the wildcard, the second
    if r == 1:
        first, second = np.full(4, -1, np.int32), np.full(4, -1, np.int32)
        wf = comm.irecv(first, 0, tag=3)
        ws = comm.irecv(second, ANY_SOURCE, 3)
        await comm.barrier()
        await asyncio.gather(wf, ws)
        ck.same("the specific receive posted first", first, np.arange(4, dtype=np.int32))
        ck.same("then the wildcard", second, np.arange(4, dtype=np.int32) + 10)
        ck.true("the wildcard's status", ws.status == aioccl.Status(0, 3))
    else:
        await comm.barrier()
        if r == 0:
            await comm.isend(np.arange(4, dtype=np.int32), 1, tag=3)
            await comm.isend(np.arange(4, dtype=np.int32) + 10, 1, tag=3)
    await comm.barrier()

    # large messages from any source: rendezvous (flow control at the sender), data exact
    last = n - 1
    if r == last:
        for _ in range(n - 1):
            buf = np.full(big, -1.0, np.float32)
            w = comm.irecv(buf, ANY_SOURCE, 7)
            await w
            ck.same(f"large message from {w.status.source}", buf,
                    (np.arange(big) % 251 + w.status.source).astype(np.float32))
    else:
        await comm.isend((np.arange(big) % 251 + r).astype(np.float32), last, tag=7)
    await comm.barrier()

    # a wildcard receive with nobody sending passes its deadline, naming every other rank; the
    # communicator goes on
    try:
        await comm.irecv(np.zeros(1, np.int8), ANY_SOURCE, ANY_TAG, timeout=0.3)
        ck.true("a receive nobody sends to times out", False)
    except aioccl.CollectiveTimeout as e:
        ck.true(f"timeout names the others: {e}", e.waiting_for == [s for s in range(n) if s != r])
    for bad in (-2, n):
        try:
            comm.irecv(np.zeros(1), bad)
            ck.true(f"source {bad} refused", False)
        except aioccl.InvalidArgument:
            pass
    try:
        comm.irecv(np.zeros(1), ANY_SOURCE, tag=-5)
        ck.true("tag -5 refused", False)
    except aioccl.InvalidArgument:
        pass
    y = await comm.all_reduce(np.ones(4, np.int32))
    ck.same("usable after", y, np.full(4, n, np.int32))
    await comm.close()
    ck.finish(f"any_source n={n}")


asyncio.run(main())
