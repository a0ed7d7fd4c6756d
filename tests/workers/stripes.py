"""Run with AIOCCL_NSOCKS > 1 over sockets: messages of 1 MiB and more are striped over several streams."""

from __future__ import annotations

import asyncio
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import aioccl  # noqa: E402

from _check import Checker, data, poison, reduced  # noqa: E402

MIB = 1 << 20


async def main() -> None:
    comm = await aioccl.init(timeout=60)
    ck = Checker(comm.rank)
    n, r = comm.world_size, comm.rank
    conn = comm._engine.conns[(r + 1) % n]
    stripes = getattr(conn, "stripes", None)
    ck.true(f"3 streams to each peer (got {conn!r})", stripes is not None and stripes.parts == 3)
    pairs = comm.topology().pairs
    ck.true(f"the topology says so: {pairs}", set(pairs.values()) == {"tcp(3 streams)"})
    # chunks of 4 MiB per message: sizes just under, at and over the striping threshold, and ragged ones
    for count in (MIB // 4 - 1, MIB // 4, 3 * MIB + 5, 2 * n * MIB + 7):
        for dt in (np.float32, np.int8):
            tag = f"{np.dtype(dt).name} x {count}"
            x = data(r, count, dt)
            await comm.all_reduce(x)
            ck.same(f"all_reduce {tag}", x, reduced(n, count, dt, "sum"))
            out = poison(n * count, dt)
            await comm.all_gather(data(r, count, dt), out)
            ck.same(f"all_gather {tag}", out, np.concatenate([data(j, count, dt) for j in range(n)]))
            b = data(r, count, dt) if r == n - 1 else poison(count, dt)
            await comm.broadcast(b, root=n - 1)
            ck.same(f"broadcast {tag}", b, data(n - 1, count, dt))
    # point to point, both ways at once and several in flight: eager (<= 1 MiB) and rendezvous messages
    right, left = (r + 1) % n, (r - 1) % n
    sizes = (MIB - 3, MIB, 9 * MIB + 11)
    outs = [poison(s, np.uint8) for s in sizes]
    recvs = [comm.irecv(o, left, tag=t) for t, o in enumerate(outs)]
    sends = [comm.isend(data(r, s, np.uint8), right, tag=t) for t, s in enumerate(sizes)]
    await asyncio.gather(*sends, *recvs)
    for s, o in zip(sizes, outs, strict=True):
        ck.same(f"p2p {s} bytes", o, data(left, s, np.uint8))
    # many collectives in flight at once over the same streams
    xs = [data(r + k, MIB + k, np.int32) for k in range(4)]
    await asyncio.gather(*(comm.all_reduce(x) for x in xs))
    for k, x in enumerate(xs):
        want = sum(data(j + k, MIB + k, np.int64) for j in range(n)).astype(np.int32)
        ck.same(f"concurrent all_reduce {k}", x, want)
    await comm.close()
    if not ck.failures:
        print("stripes ok", flush=True)
    ck.finish(f"rank {r}")


asyncio.run(main())
