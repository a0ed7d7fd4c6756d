"""The peer for scripts/gpu-check.sh: all_reduce busbw through cupy.cuda.nccl, same sizes as aioccl-perf.

    python scripts/nccl_sweep.py --np 2 [--json FILE]

One process per rank (multiprocessing, spawn), rank r on GPU ``r % ngpus``.
NCCL refuses two ranks on one GPU, so with fewer GPUs than ranks this exits
3 with that reason instead of a number. Exits 3 as well without the
nvidia-nccl wheel or cupy's nccl module.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
import warnings


def _rank(rank: int, n: int, uid: bytes, sizes: list[int], iters: int, q: mp.Queue) -> None:
    import cupy as cp
    from cupy.cuda import nccl

    cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()
    comm = nccl.NcclCommunicator(n, uid, rank)
    stream = cp.cuda.Stream(non_blocking=True)
    rows = []
    for size in sizes:
        count = size // 4
        x = cp.ones(count, cp.float32)
        y = cp.empty_like(x)
        for _ in range(5):
            comm.allReduce(x.data.ptr, y.data.ptr, count, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
        stream.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            comm.allReduce(x.data.ptr, y.data.ptr, count, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
        stream.synchronize()
        t = (time.perf_counter() - t0) / iters
        alg = size / t / 1e9
        rows.append({"size": size, "time_us": t * 1e6, "algbw": alg, "busbw": alg * 2 * (n - 1) / n})
    if rank == 0:
        q.put(rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json")
    ns = p.parse_args()
    warnings.filterwarnings("ignore", message="nccl library could not be loaded")
    try:
        import cupy as cp
        from cupy.cuda import nccl

        nccl.get_version()  # raises where libnccl.so.2 (the nvidia-nccl wheel) is missing
        gpus = cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - ImportError, CUDARuntimeError, RuntimeError: all mean "no peer here"
        print(f"no NCCL through cupy here: {type(e).__name__}: {str(e).strip().splitlines()[0]}")
        return 3
    if gpus < ns.np:
        print(f"NCCL needs one GPU per rank ({ns.np} ranks, {gpus} GPU(s)): it refuses duplicate GPUs")
        return 3
    sizes = [8 << (2 * i) for i in range(13) if 8 << (2 * i) <= 64 << 20]
    uid = nccl.get_unique_id()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, ns.np, uid, sizes, ns.iters, q)) for r in range(ns.np)]
    for pr in procs:
        pr.start()
    rows = q.get(timeout=600)
    for pr in procs:
        pr.join()
    print(f"# NCCL {nccl.get_version()} all_reduce float32, {ns.np} ranks")
    print(f"# {'size':>10} {'time(us)':>10} {'algbw':>8} {'busbw':>8}")
    for row in rows:
        print(f"  {row['size']:>10} {row['time_us']:>10.2f} {row['algbw']:>8.2f} {row['busbw']:>8.2f}")
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump({"tool": "nccl_sweep", "nranks": ns.np, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
