"""Where an op on GPU buffers spends its time on the host: enqueue rate, per-op latency with a stream
sync, and a cProfile of the enqueue path (rank 0). Run under the launcher:

    aioccl-run --nproc-per-node 2 benchmarks/gpu_op_profile.py [NBYTES]
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import time

import cupy as cp
import numpy as np

import aioccl


def main() -> None:
    nbytes = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    comm = aioccl.init_sync(timeout=60)
    x = cp.ones(max(1, nbytes // 4), np.float32)
    s = cp.cuda.get_current_stream()
    for _ in range(50):
        comm.all_reduce(x).wait()
    s.synchronize()
    comm.barrier().wait()
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        comm.all_reduce(x)
    t_enq = time.perf_counter() - t0
    s.synchronize()
    t_all = time.perf_counter() - t0
    comm.barrier().wait()
    lat = []
    for _ in range(500):
        t = time.perf_counter()
        comm.all_reduce(x)
        s.synchronize()
        lat.append(time.perf_counter() - t)
    comm.barrier().wait()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(300):
        comm.all_reduce(x)
    s.synchronize()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(14)
    path = comm._launcher.gpu.path
    print(f"PROFILE rank={comm.rank} path={path} bytes={nbytes} enqueue={t_enq / n * 1e6:.1f}us/op "
          f"pipelined={t_all / n * 1e6:.1f}us/op synced_median={np.median(lat) * 1e6:.1f}us "
          f"p10={np.percentile(lat, 10) * 1e6:.1f}us", flush=True)
    if comm.rank == 0 and os.environ.get("PROFILE_STATS", "1") == "1":
        print(out.getvalue()[:3500], flush=True)
    comm.close().wait()


main()
