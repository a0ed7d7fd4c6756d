"""Collectives on namespace hosts while the network misbehaves (tests/test_bad_network.py sets it up).

    aioccl-run --nnodes H ... bad_network.py MODE

MODE ``mixed``: 500 collectives of every kind, exact data, every element checked, each under a deadline.
MODE ``loop``: all_reduces until the test creates TEST_DIR/stop (the test flaps or cuts a link meanwhile);
a failure is reported as data (its type, the ranks it names, when), then the survivors ``shrink()``
and check an all_reduce among themselves. Each rank prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import aioccl  # noqa: E402

OP_TIMEOUT = float(os.environ.get("TEST_OP_TIMEOUT", "30"))
BIG_P2P = os.environ.get("TEST_BIG_P2P") == "1"


def cyclic(size: int, shift: int, mod: int) -> np.ndarray:
    """``(np.arange(size) + shift) % mod``, made by repeating one period: a modulo over 3 Mi int64s took
    23 ms, twice per big message, half of what the six ranks spent under the 1%-loss test."""
    return np.tile((np.arange(mod) + shift) % mod, -(-size // mod))[:size]


async def one(comm: aioccl.Communicator, i: int) -> bool:
    """Collective number ``i`` (its kind and size chosen by i); True when every element is right."""
    n, r = comm.world_size, comm.rank
    kind, t = i % 9, OP_TIMEOUT
    if kind == 0:
        x = np.arange(7, dtype=np.int64) + r + i
        await comm.all_reduce(x, timeout=t)
        return bool((x == n * (np.arange(7) + i) + n * (n - 1) // 2).all())
    if kind in (1, 8):
        count = 1 << 18 if kind == 8 else 16_384  # 1 MiB, 64 KiB of float32
        x = (cyclic(count, i, 13) + r).astype(np.float32)
        await comm.all_reduce(x, timeout=t)
        return bool((x == (n * cyclic(count, i, 13) + n * (n - 1) // 2).astype(np.float32)).all())
    root = i % n
    if kind == 2:
        x = np.arange(1000, dtype=np.int32) * (i + 1) if r == root else np.full(1000, -1, np.int32)
        await comm.broadcast(x, root=root, timeout=t)
        return bool((x == np.arange(1000, dtype=np.int32) * (i + 1)).all())
    if kind == 3:
        g = await comm.all_gather(np.full(100, r * 1000 + i, np.int32), timeout=t)
        return bool((g == np.repeat(np.arange(n) * 1000 + i, 100)).all())
    if kind == 4:
        x = (np.arange(n * 50) % 17 + r + i).astype(np.float64)
        out = np.full(50, np.nan)
        await comm.reduce_scatter(x, out=out, timeout=t)
        want = (n * (np.arange(n * 50) % 17) + n * (i + (n - 1) / 2))[r * 50:(r + 1) * 50]
        return bool((out == want).all())
    if kind == 5:
        x = np.full(333, r + 1, np.int64)
        out = np.full(333, -1, np.int64)
        await comm.reduce(x, root=root, out=out, timeout=t)
        return bool((out == (n * (n + 1) // 2 if r == root else -1)).all())
    if kind == 6:
        x = np.arange(n * 10, dtype=np.int32) + 1000 * r
        await comm.all_to_all(x, timeout=t)
        return bool((x == np.concatenate([np.arange(r * 10, r * 10 + 10) + 1000 * j for j in range(n)])).all())
    if BIG_P2P:  # kind 7: 3 MiB and a few bytes to the next host's rank, striped when the pair has stripe sockets
        size = (3 << 20) + i % 5
        right, left = (r + comm.local_world_size) % n, (r - comm.local_world_size) % n
        got = np.full(size, 255, np.uint8)
        recv = comm.irecv(got, left, tag=i, timeout=t)
        await comm.isend(cyclic(size, i * 7 + r, 251).astype(np.uint8), right, tag=i, timeout=t)
        await recv
        return bool((got == cyclic(size, i * 7 + left, 251).astype(np.uint8)).all())
    await comm.barrier(timeout=t)
    return True


async def mixed(comm: aioccl.Communicator) -> dict[str, object]:
    wrong, slowest = [], 0.0
    t0 = time.monotonic()
    for i in range(500):
        start = time.monotonic()
        if not await one(comm, i):
            wrong.append(i)
        slowest = max(slowest, time.monotonic() - start)
    return {"ops": 500, "wrong": wrong, "slowest_s": slowest, "total_s": time.monotonic() - t0}


async def loop(comm: aioccl.Communicator) -> dict[str, object]:
    stop = os.path.join(os.environ["TEST_DIR"], "stop")
    open(os.path.join(os.environ["TEST_DIR"], f"looping-{comm.rank}"), "w").close()
    ops, wrong, slowest = 0, 0, 0.0
    while True:
        start = time.monotonic()
        try:
            seen = np.array([os.path.exists(stop)], np.int32)  # stop together: nobody leaves a peer mid-op
            await comm.all_reduce(seen, op="max", timeout=OP_TIMEOUT)
            slowest = max(slowest, time.monotonic() - start)
            if seen[0]:
                break
            ok = await one(comm, 8 if ops % 2 else 1)
        except (aioccl.PeerLost, aioccl.CollectiveTimeout) as e:
            named = [e.rank] if isinstance(e, aioccl.PeerLost) else e.waiting_for
            res: dict[str, object] = {"ops": ops, "wrong": wrong, "failed": type(e).__name__, "named": named,
                                      "at": time.time(), "message": str(e).splitlines()[0]}
            try:
                small = await comm.shrink(timeout=OP_TIMEOUT)
                x = np.full(5, comm.rank + 1, np.int64)
                await small.all_reduce(x, timeout=OP_TIMEOUT)
                res["shrunk"] = {"size": small.world_size, "sum": int(x[0])}
                await small.close()
            except aioccl.AiocclError as e2:
                res["shrunk"] = {"error": str(e2).splitlines()[0]}
            return res
        wrong += not ok
        slowest = max(slowest, time.monotonic() - start)
        ops += 1
        done = os.path.join(os.environ["TEST_DIR"], f"ops-{comm.rank}")  # (for a test that waits for progress)
        with open(done + ".tmp", "w") as f:
            f.write(str(ops))
        os.replace(done + ".tmp", done)
    return {"ops": ops, "wrong": wrong, "slowest_s": slowest}


async def main() -> None:
    comm = await aioccl.init(timeout=float(os.environ.get("TEST_INIT_TIMEOUT", "60")))
    res = await (mixed(comm) if sys.argv[1] == "mixed" else loop(comm))
    res.update(rank=comm.rank, host=os.environ.get("TEST_HOST"))
    print("RESULT " + json.dumps(res), flush=True)
    if "failed" in res:
        comm.abort()
    else:
        await comm.close()


asyncio.run(main())
