"""Soak: every rank runs the same long random sequence of ops (same seed), checking every element.

    aioccl-run --nproc-per-node 4 soak.py [OPS]

Sizes, dtypes, ops and roots are drawn from one seeded generator, so all
ranks issue the same calls; data are small integers, so every result is
exact. Private resident memory and open file descriptors are sampled
half-way and at the end and must stay flat; the scratch pool must stay
within a small bound (it fills its size classes as sizes first appear).
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import aioccl  # noqa: E402

from _check import DTYPES, data, reduced  # noqa: E402


def rss_kib(kind: str = "RssAnon") -> int:
    """Private resident memory: what a leak grows (RssShmem also counts peers' shared pages once touched).

    Freed heap is handed back to the kernel first (glibc's malloc_trim), so
    the number reflects live memory rather than the allocator's high-water
    mark after this worker's own multi-MiB temporaries.
    """
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(kind + ":"))


async def main() -> None:
    total = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    comm = await aioccl.init(timeout=120)
    n, r = comm.world_size, comm.rank
    rng = np.random.default_rng(2026)
    kinds = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather",
             "scatter", "barrier", "sendrecv"]
    counts = dict.fromkeys(kinds, 0)
    wrong = 0
    base: tuple[int, int] | None = None
    t0 = time.perf_counter()
    for i in range(total):
        kind = kinds[rng.integers(len(kinds))]
        dt = DTYPES[rng.integers(len(DTYPES))]
        count = n * int(rng.choice([1, 3, 17, 256, 1000, 4096, 65536], p=[.2, .2, .2, .15, .1, .1, .05]))
        root = int(rng.integers(n))
        op = "max" if rng.random() < 0.2 else "sum"
        x = data(r, count, dt, op)
        if kind == "all_reduce":
            got, want = await comm.all_reduce(x, op=op), reduced(n, count, dt, op)
        elif kind == "broadcast":
            got, want = await comm.broadcast(x, root=root), data(root, count, dt)
        elif kind == "reduce":
            got = await comm.reduce(x, root=root, op=op)
            want = reduced(n, count, dt, op) if r == root else got
        elif kind == "all_gather":
            got, want = await comm.all_gather(x), np.concatenate([data(j, count, dt) for j in range(n)])
        elif kind == "reduce_scatter":
            b = count // n
            got, want = await comm.reduce_scatter(x, op=op), reduced(n, count, dt, op)[r * b:(r + 1) * b]
        elif kind == "all_to_all":
            b = count // n
            got = await comm.all_to_all(x)
            want = np.concatenate([data(j, count, dt)[r * b:(r + 1) * b] for j in range(n)])
        elif kind == "gather":
            got = await comm.gather(x, root=root)
            want = np.concatenate([data(j, count, dt) for j in range(n)]) if r == root else None
        elif kind == "scatter":
            b = count // n
            got = await comm.scatter(data(root, count, dt) if r == root else None, root=root,
                                     out=None if r == root else np.empty(b, dt))
            want = data(root, count, dt)[r * b:(r + 1) * b]
        elif kind == "barrier":
            got = want = await comm.barrier()
        else:
            buf = np.empty(count, dt)
            recv = comm.irecv(buf, (r - 1) % n, tag=i)
            await comm.isend(x, (r + 1) % n, tag=i)
            got, want = await recv, data((r - 1) % n, count, dt)
        counts[kind] += 1
        if want is None:
            ok = got is None
        elif isinstance(want, np.ndarray):
            ok = got is not None and got.shape == want.shape and bool(np.array_equal(got, want))
        else:
            ok = True
        if not ok:
            wrong += 1
            print(f"rank {r}: op {i} {kind} {np.dtype(dt).name} x{count} root {root} WRONG", flush=True)
        if i == total // 2:  # after the warm-up that fills the scratch pool's size classes
            base = (rss_kib(), len(os.listdir("/proc/self/fd")), comm._engine.pool.allocated_bytes)
        if i % (total // 10) == 0 and os.environ.get("SOAK_TRACE"):
            print(f"rank {r} op {i}: private rss {rss_kib()} KiB, pool {comm._engine.pool.allocated_bytes}",
                  flush=True)
    took = time.perf_counter() - t0
    assert base is not None
    rss, fds, pool = rss_kib(), len(os.listdir("/proc/self/fd")), comm._engine.pool.allocated_bytes
    print(f"SOAK rank {r}: {total} ops in {took:.1f}s, wrong {wrong}, private rss {base[0]}->{rss} KiB "
          f"(shared {rss_kib('RssShmem')} KiB), "
          f"p2p queues {len(comm._engine.mailbox.p2p_posted) + len(comm._engine.mailbox.p2p_early)}, "
          f"fds {base[1]}->{fds}, pool {base[2]}->{pool} B, pending {len(comm.pending())}, kinds {counts}", flush=True)
    await comm.close()
    # a leak of 1 KiB per op would add 5 MiB over the second half. The scratch pool fills its power-of-two
    # size classes lazily (a rare large op may first come late), so it is held to a bound, not to flatness:
    # a leaked scratch buffer per op would pass the bound within a few hundred ops.
    problems = [what for what, bad in (("wrong results", wrong), ("memory grew", rss - base[0] > 4 * 1024),
                                       ("fds grew", fds != base[1]), ("pool over 16 MiB", pool > 16 << 20)) if bad]
    if problems:
        sys.exit(f"rank {r}: {', '.join(problems)}")


asyncio.run(main())
