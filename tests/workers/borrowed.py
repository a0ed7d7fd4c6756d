"""Small ops from two threads through the synchronous API (a proxy engine), checked element by element;
prints how many completed inside the call that issued them (the engine borrowed)."""

from __future__ import annotations

import os
import sys
import threading

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import aioccl  # noqa: E402

from _check import Checker  # noqa: E402

comm = aioccl.init_sync(timeout=60)
ck = Checker(comm.rank)
n, r = comm.world_size, comm.rank
halves = comm.split(color=0, key=r).wait(), comm.split(color=0, key=r).wait()  # two communicators, one engine
inside = [0, 0]


def issue(k: int, c: aioccl.Communicator | None) -> None:
    try:
        ops(k, c)
    except Exception as e:  # noqa: BLE001  (a thread's error must fail the check, not vanish)
        ck.true(f"thread {k}: {e!r}", False)


def ops(k: int, c: aioccl.Communicator | None) -> None:
    assert c is not None
    for i in range(300):
        x = np.full(4, r + i + k, np.int64)
        w = c.all_reduce(x)
        inside[k] += w.done()
        w.wait()
        want = np.full(4, sum(q + i + k for q in range(n)), np.int64)
        if not np.array_equal(x, want):
            ck.same(f"thread {k} op {i}", x, want)
            return
        if i == 150:
            big = np.full(1 << 18, r + 1, np.float32)  # 1 MiB: stays on the engine's thread
            c.all_reduce(big).wait()
            ck.same(f"thread {k} large op", big, np.full(1 << 18, n * (n + 1) / 2, np.float32))


threads = [threading.Thread(target=issue, args=(k, c)) for k, c in enumerate(halves)]
for t in threads:
    t.start()
for t in threads:
    t.join()
ck.true("both threads done", not any(t.is_alive() for t in threads))
print(f"[rank {r}] ops done inside the call: {inside[0]} + {inside[1]} of 600", flush=True)
for c in halves:
    c.close().wait()
comm.close().wait()
ck.finish(f"borrowed n={n}")
