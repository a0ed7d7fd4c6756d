"""comm.abort() frees a GPU op that waits for a peer which never comes, long before the op's deadline.

    aioccl-run --nproc-per-node 2 gpu_abort.py

Rank 0 issues an all_reduce with a 60 s deadline that rank 1 never joins, then aborts the communicator: the
kernel spinning on rank 1's flag gives up (spin form) or the stream's wait is freed (stream form), so the
device synchronises within seconds. Prints ``ABORT_OK``.
"""

from __future__ import annotations

import os
import sys
import time

import cupy as cp
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import aioccl  # noqa: E402


def main() -> None:
    comm = aioccl.init_sync(timeout=60)
    r = comm.rank
    comm.all_reduce(cp.asarray(np.ones(4, np.float32))).wait()  # both: the GPU path is set up
    cp.cuda.Device().synchronize()
    if r == 0:
        comm.all_reduce(cp.asarray(np.ones(8, np.float32)), timeout=60.0).wait()  # rank 1 never comes
        time.sleep(0.3)
        t0 = time.monotonic()
        comm.abort()
        cp.cuda.Device().synchronize()
        took = time.monotonic() - t0
        assert took < 10, took
        print(f"ABORT_OK rank=0 synchronised {took:.2f}s after abort() path={comm._launcher.gpu.path}", flush=True)
    else:
        time.sleep(3)
        print(f"ABORT_OK rank={r}", flush=True)
        comm.abort()


main()
