"""A GPU op that one rank never issues ends at its deadline on the device, and the next op names it.

    aioccl-run --nproc-per-node 2 gpu_timeout.py

Rank 0 issues an all_reduce (timeout 1 s) that the other ranks never join. Its Work is done at enqueue (the device
path's rule); on the GPU the kernel gives up at the deadline (spin form), or the engine's watch finds the op
past it and frees the stream's waits (stream form). Rank 0's next GPU op must raise ``CollectiveTimeout``
naming the ranks it waited for, and so must every later one; close() must then return. Prints ``TIMEOUT_OK``. Every op
here is float32, so no kernel is loaded while a stream waits (a CUDA module load may wait for the device).
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
    x = cp.asarray(np.arange(4, dtype=np.float32) + r)
    comm.all_reduce(x).wait()  # both: the GPU path is set up
    cp.cuda.Device().synchronize()
    t0 = time.monotonic()
    if r == 0:
        comm.all_reduce(cp.asarray(np.ones(8, np.float32)), timeout=1.0).wait()  # done at enqueue; rank 1 never comes
        deadline = time.monotonic() + 20
        while True:
            time.sleep(0.1)
            try:
                comm.all_reduce(cp.asarray(np.ones(2, np.float32)), timeout=1.0)
            except aioccl.CollectiveTimeout as exc:
                assert exc.waiting_for and set(exc.waiting_for) <= set(range(1, comm.world_size)), exc
                assert "all_reduce" in str(exc), exc
                err = exc
                break
            if time.monotonic() > deadline:
                raise AssertionError("the lonely op's deadline never surfaced")
        try:
            comm.all_reduce(cp.asarray(np.ones(2, np.float32)))
        except aioccl.CollectiveTimeout:
            pass
        else:
            raise AssertionError("a failed device path accepted another op")
        print(f"TIMEOUT_OK rank=0 after={time.monotonic() - t0:.1f}s path={comm._launcher.gpu.path}: {err}", flush=True)
    else:
        time.sleep(4)
        print(f"TIMEOUT_OK rank={r} path={comm._launcher.gpu.path}", flush=True)
    comm.close().wait()


main()
