"""One rank per "host" (network namespace): check addresses and data, then loop until the link is cut.

Every rank must end with ``PeerLost`` or ``CollectiveTimeout`` after the
test takes one host's link down, and say when (wall clock), so the test can
check it happened within the deadline.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import aioccl  # noqa: E402

from _check import Checker  # noqa: E402

OP_TIMEOUT = 4.0


async def main() -> None:
    comm = await aioccl.init(timeout=60)
    ck = Checker(comm.rank)
    n, r = comm.world_size, comm.rank
    subnet = os.environ["TEST_SUBNET"]
    addrs = [p["addr"] for p in comm._engine.table.peers]
    ck.true(f"every rank advertises its bridge address {addrs}",
            all(a.startswith(subnet + ".") for a in addrs) and len(set(addrs)) == n)
    ck.true("each rank is alone on its host", comm.local_world_size == 1 and len(set(comm._hosts)) == n)
    for count in (5, 200_000):
        x = (np.arange(count) % 7 + r).astype(np.int64)
        await comm.all_reduce(x)
        ck.same(f"all_reduce {count}", x, (n * (np.arange(count) % 7) + n * (n - 1) // 2).astype(np.int64))
    g = await comm.all_gather(np.full(3, r, np.int32))
    ck.same("all_gather", g, np.repeat(np.arange(n, dtype=np.int32), 3))
    ck.finish(f"rank {r} on {os.environ.get('TEST_HOST')}")
    with open(os.path.join(os.environ["TEST_DIR"], f"looping-{r}"), "w"):
        pass
    x = np.ones(1 << 18, np.float32)
    ops = 0
    while True:
        try:
            await comm.all_reduce(x, op="max", timeout=OP_TIMEOUT)
            ops += 1
        except (aioccl.PeerLost, aioccl.CollectiveTimeout) as e:
            print(f"FAILED-AS-DATA rank {r} {type(e).__name__} at {time.time():.3f} after {ops} ops: {e}",
                  flush=True)
            break
    comm.abort()


asyncio.run(main())
