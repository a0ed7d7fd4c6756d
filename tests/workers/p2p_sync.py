"""Point-to-point in real processes, and the synchronous API (init_sync + wait)."""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import aioccl  # noqa: E402

from _check import Checker  # noqa: E402

comm = aioccl.init_sync(timeout=30)
ck = Checker(comm.rank)
n, r = comm.world_size, comm.rank
ck.true("sync placement is a proxy thread", comm.engine_placement == "thread")
# ring exchange, posted out of order: receive tag 2 before tag 1
right, left = (r + 1) % n, (r - 1) % n
a = np.zeros(1000, np.float32)
b = np.zeros(3, np.int64)
w2 = comm.irecv(b, left, tag=2)
w1 = comm.irecv(a, left, tag=1)
s1 = comm.isend(np.full(1000, left + r, np.float32), right, tag=1)
s2 = comm.isend(np.arange(3) + r, right, tag=2)
for w in (s1, s2, w1, w2):
    w.wait(timeout=30)
ck.same("tag 1 from the left", a, np.full(1000, (left - 1) % n + left, np.float32))
ck.same("tag 2 from the left", b, np.arange(3) + left)
y = comm.all_reduce(np.ones(5, np.int32)).wait()
ck.same("sync all_reduce", y, np.full(5, n, np.int32))
with comm.group():
    ws = [comm.isend(np.array([r], np.int64), j, tag=9) for j in range(n)]
    outs = [np.zeros(1, np.int64) for _ in range(n)]
    wr = [comm.irecv(outs[j], j, tag=9) for j in range(n)]
ck.true("sync group completed everything", all(w.done() for w in ws + wr))
ck.same("sync group all-to-all by p2p", np.concatenate(outs), np.arange(n, dtype=np.int64))
comm.barrier().wait()
comm.close().wait()
ck.finish(f"p2p_sync n={n}")
