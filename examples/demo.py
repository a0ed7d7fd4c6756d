"""`make demo`: every collective on real data with checks, then an nccl-tests-style table.

    aioccl-run --nproc-per-node 4 examples/demo.py [--max-bytes 64M]

Times are the median over iterations of the slowest rank (taken with an aioccl
all_reduce(max), of course). busbw follows nccl-tests: algbw x 2(n-1)/n for
all_reduce, so numbers compare with the hardware's link speed.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np

import aioccl


def parse_size(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s[-1].upper() in units else int(s)


async def check_everything(comm: aioccl.Communicator) -> list[tuple[str, bool]]:
    """Each op on small exact integers; returns (name, ok) and says which rank saw what."""
    n, r = comm.world_size, comm.rank
    base = np.arange(1000) % 7
    results = []

    x = (base + r).astype(np.float32)
    await comm.all_reduce(x)
    results.append(("all_reduce", np.array_equal(x, n * base + n * (n - 1) // 2)))
    b = np.arange(1000, dtype=np.int64) if r == 0 else np.full(1000, -1, np.int64)
    await comm.broadcast(b, root=0)
    results.append(("broadcast", np.array_equal(b, np.arange(1000))))
    x = (base + r).astype(np.int32)
    y = await comm.reduce(x, root=n - 1, out=np.full(1000, -1, np.int32))
    results.append(("reduce", r != n - 1 or np.array_equal(y, n * base + n * (n - 1) // 2)))
    g = await comm.all_gather(np.full(3, r, np.float64))
    results.append(("all_gather", np.array_equal(g, np.repeat(np.arange(n), 3))))
    s = await comm.reduce_scatter(np.arange(4 * n, dtype=np.float32), out=np.full(4, np.nan, np.float32))
    results.append(("reduce_scatter", np.array_equal(s, n * np.arange(4 * r, 4 * r + 4))))
    g = await comm.gather(np.array([r * r]), root=0, out=np.zeros(n, np.int64) if r == 0 else None)
    results.append(("gather", r != 0 or np.array_equal(g, np.arange(n) ** 2)))
    sc = await comm.scatter(np.arange(2 * n) if r == 0 else None, root=0, out=np.full(2, -1, np.int64))
    results.append(("scatter", np.array_equal(sc, [2 * r, 2 * r + 1])))
    a = await comm.all_to_all(np.arange(n) + 100 * r)
    results.append(("all_to_all", np.array_equal(a, np.arange(n) * 100 + r)))
    await comm.barrier()
    results.append(("barrier", True))
    got = np.zeros(4)
    recv = comm.irecv(got, (r - 1) % n, tag=1)
    await comm.isend(np.full(4, float(r)), (r + 1) % n, tag=1)
    await recv
    results.append(("send/recv", np.array_equal(got, np.full(4, float((r - 1) % n)))))
    return results


async def time_all_reduce(comm: aioccl.Communicator, nbytes: int, in_place: bool,
                          registered: bool = False) -> tuple[float, int]:
    count = nbytes // 4
    iters = max(3, min(200, (32 << 20) // max(nbytes, 1)))
    x = comm.alloc(count, np.float32) if registered else np.empty(count, np.float32)
    x[...] = (np.arange(count) % 5) + comm.rank
    out = None if in_place else np.empty_like(x)
    want = (count and (comm.world_size * (np.arange(count) % 5)
                       + comm.world_size * (comm.world_size - 1) // 2).astype(np.float32))
    wrong = 0
    # correctness on fresh data, then warm-up and timed iterations
    res = await comm.all_reduce(x, out=out)
    wrong += int(np.count_nonzero(res != want)) if count else 0
    x[...] = 0  # timed iterations repeat in place: zeros never overflow, and the speed is the same
    for _ in range(2):
        await comm.all_reduce(x, out=out)
    times = []
    for _ in range(iters):
        await comm.barrier()
        t0 = time.perf_counter()
        await comm.all_reduce(x, out=out)
        times.append(time.perf_counter() - t0)
    mine = np.array([np.median(times)])
    await comm.all_reduce(mine, op="max")
    total_wrong = np.array([wrong], np.int64)
    await comm.all_reduce(total_wrong)
    return float(mine[0]), int(total_wrong[0])


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-bytes", default="64M")
    ap.add_argument("--min-bytes", default="8")
    args = ap.parse_args()
    comm = await aioccl.init()
    n, r = comm.world_size, comm.rank
    say = print if r == 0 else (lambda *a, **k: None)
    say(f"# aioccl {aioccl.__version__}: {n} ranks, {comm.local_world_size} on this host, "
        f"engine {comm.engine_placement}, transport {comm.transport}")
    results = await check_everything(comm)
    oks = np.array([ok for _, ok in results], np.int64)
    await comm.all_reduce(oks, op="min")
    say("# correctness (every rank, exact data):")
    for (name, _), ok in zip(results, oks, strict=True):
        say(f"#   {name:<15} {'ok' if ok else 'WRONG'}")
    say("#")
    say("# all_reduce float32 sum. time = median of the slowest rank; busbw = algbw * 2(n-1)/n")
    say("# registered: in place on a comm.alloc array (peers on this host read it where it lies)")
    say(f"# {'':>34}{'out-of-place':^34}{'in-place':^34}{'registered':^34}")
    col = f" {'time(us)':>10} {'algbw':>7} {'busbw':>7} {'#wrong':>6}"
    say(f"# {'size':>12} {'count':>12} {'type':>8}{col}{col}{col}")
    size, top = parse_size(args.min_bytes), parse_size(args.max_bytes)
    total_wrong = 0
    while size <= top:
        cols = []
        for in_place, registered in ((False, False), (True, False), (True, True)):
            t, wrong = await time_all_reduce(comm, size, in_place, registered)
            total_wrong += wrong
            alg = size / t / 1e9
            cols.append(f"{t * 1e6:>10.1f} {alg:>7.3f} {alg * 2 * (n - 1) / n:>7.3f} {wrong:>6}")
        say(f"  {size:>12} {size // 4:>12} {'float':>8} {' '.join(cols)}")
        size *= 8 if size < (256 << 10) else 4
    say(f"# wrong elements: {total_wrong}; all operations {'correct' if oks.all() else 'NOT correct'}")
    await comm.close()
    if total_wrong or not oks.all():
        raise SystemExit(1)


asyncio.run(main())
