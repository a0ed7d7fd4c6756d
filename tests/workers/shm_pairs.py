"""Point-to-point and child communicators over shared-memory pairs: ``shm_pairs.py SCENARIO``.

Prints ``OK <rank> <what>`` per check that passed; any failure raises (non-zero exit).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import numpy as np

import aioccl

SIZES = [0, 1, 2, 16383, 16384, 3 * 16384 + 7, 5 << 18]  # int32 elements; the test's ring holds 64 KiB


def data(src: int, dst: int, n: int) -> np.ndarray:
    return ((np.arange(n, dtype=np.int64) * 7 + 1000 * src + dst) % 100_003).astype(np.int32)


async def p2p(comm: aioccl.Communicator) -> None:
    r, n = comm.rank, comm.world_size
    assert all(comm.transport_to(p) == ("self" if p == r else "shm") for p in range(n)), comm.transport
    for size in SIZES:
        got = {p: np.full(size, -7, np.int32) for p in range(n) if p != r}  # poisoned
        recvs = [comm.irecv(got[p], p, tag=size % 1000) for p in got]
        sends = [comm.isend(data(r, p, size), p, tag=size % 1000) for p in got]
        await asyncio.gather(*recvs, *sends)  # every rank sends to every other at once: no deadlock
        for p, buf in got.items():
            bad = np.flatnonzero(buf != data(p, r, size))
            assert bad.size == 0, (size, p, bad[:5])
    print(f"OK {r} p2p {len(SIZES)} sizes", flush=True)


async def children(comm: aioccl.Communicator) -> None:
    r, n = comm.rank, comm.world_size
    sub = await comm.split(0, key=-r)
    assert sub is not None and sub.rank == n - 1 - r and sub.transport == "shm", (sub, sub and sub.transport)
    for count in (1, 1000, 3 << 18):
        x = np.full(count, r + 1, np.int64)
        await sub.all_reduce(x)
        assert (x == n * (n + 1) // 2).all(), count
        b = np.arange(count, dtype=np.float32) if sub.rank == 0 else np.full(count, -1.0, np.float32)
        await sub.broadcast(b, root=0)
        assert (b == np.arange(count, dtype=np.float32)).all(), count
    await sub.close()
    print(f"OK {r} children", flush=True)


async def peer_killed(comm: aioccl.Communicator) -> None:
    """Rank 1 waits in a receive from rank 2, which dies: PeerLost(2) at once, not at the deadline."""
    await comm.barrier()
    if comm.rank == 2:
        await asyncio.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)
    if comm.rank == 1:
        t0 = time.monotonic()
        try:
            await comm.irecv(np.empty(10, np.int32), 2, timeout=60)
        except aioccl.PeerLost as e:
            assert e.rank == 2 and time.monotonic() - t0 < 5.0, (e, time.monotonic() - t0)
            print(f"OK 1 lost {e.rank} after {time.monotonic() - t0:.2f}s", flush=True)
    await asyncio.sleep(0.5)
    comm.abort()


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


async def backlog(comm: aioccl.Communicator) -> None:
    """Rank 0 sends MESSAGES x 4 MiB before rank 1 posts anything: rank 1's memory must not grow by them."""
    count = int(os.environ.get("BACKLOG_MESSAGES", "40"))
    await comm.barrier()
    if comm.rank == 0:
        msgs = [np.full(1 << 20, i, np.int32) for i in range(count)]
        t0 = time.monotonic()
        await asyncio.gather(*(comm.isend(m, 1, tag=5) for m in msgs))
        print(f"OK 0 sent {count} after {time.monotonic() - t0:.2f}s", flush=True)
    else:
        before = rss_mib()
        await asyncio.sleep(1.0)  # the sender has issued everything by now
        grown = rss_mib() - before
        buf = np.empty(1 << 20, np.int32)
        for i in range(count):
            buf[:] = -1
            await comm.irecv(buf, 0, tag=5)
            assert (buf == i).all(), (i, np.unique(buf)[:5])
        print(f"OK 1 backlog {count} intact, grew {grown:.0f} MiB while unposted", flush=True)
    await comm.barrier()


async def main() -> None:
    comm = await aioccl.init(timeout=60, engine=os.environ.get("SHM_PAIRS_ENGINE", "auto"))
    await globals()[sys.argv[1]](comm)
    if sys.argv[1] != "peer_killed":
        await comm.close()


asyncio.run(main())
