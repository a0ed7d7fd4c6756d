"""Where an 8-byte ``dist.all_reduce`` on a CUDA tensor spends its time (backend "aioccl"), layer by layer.

    torchrun --nproc-per-node 2 benchmarks/gpu_torch_parts.py

Each line times 300 calls back to back, then one ``torch.cuda.synchronize()``, as ``gpu_frameworks.py torch``
does, per call: the host's time to issue the 300 (``host``) and the whole batch with the sync (``all``), the
median of 7 batches on the slower rank. From the bottom up: ``x.fill_`` alone (a torch kernel launch),
``comm.all_reduce(x)`` (aioccl's own API on the tensor: the GPU lane), the backend's ``allreduce([x])``
(aioccl's c10d ProcessGroup, what torch calls), ``dist.all_reduce(x)`` (torch's dispatch around it), and
``gpu_frameworks.py``'s loop (``fill_`` + ``dist.all_reduce``). Then a profile of rank 0's Python in that loop.
Every all_reduce result is checked (exact small integers).
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

import aioccl  # noqa: F401  (registers the backend)
from aioccl import lowlevel

CALLS = 300


def batch_times(fn: Callable[[], object]) -> tuple[float, float]:
    """(host seconds to issue CALLS calls, seconds with the final sync), medians of 7 after 2 warm-ups."""
    host, whole = [], []
    for k in range(9):
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        if k >= 2:
            host.append(t1 - t0)
            whole.append(t2 - t0)
    return statistics.median(host) / CALLS, statistics.median(whole) / CALLS


def main() -> None:
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dist.init_process_group(backend="aioccl")
    r, n = dist.get_rank(), dist.get_world_size()
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cuda"))
    comm = backend.comm
    x = torch.full((2,), float(r + 1), device="cuda")

    def fill_dist() -> None:
        x.fill_(r + 1)
        dist.all_reduce(x)

    parts = (("x.fill_", lambda: x.fill_(1.0)), ("comm.all_reduce(x)", lambda: comm.all_reduce(x)),
             ("backend.allreduce([x])", lambda: backend.allreduce([x]).wait()),
             ("dist.all_reduce(x)", lambda: dist.all_reduce(x)), ("fill_ + dist.all_reduce", fill_dist))
    lines = []
    for name, fn in parts:
        dist.barrier()
        host, whole = batch_times(fn)
        t = torch.tensor([host, whole], dtype=torch.float64, device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        lines.append(f"{name:26s} host {t[0].item() * 1e6:6.1f} us/call, with the sync {t[1].item() * 1e6:6.1f}")
    x.fill_(r + 1)
    dist.all_reduce(x)
    assert torch.all(x == n * (n + 1) // 2), f"{x} on rank {r}"
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3000):
        fill_dist()
    torch.cuda.synchronize()
    prof.disable()
    assert torch.all(x == n * (n + 1) // 2), f"{x} on rank {r}"
    if r == 0:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(16)
        print("\n".join(lines), flush=True)
        print(f"the GPU lane ran {lowlevel.gpu_lane_ran(comm)} ops", flush=True)
        print(out.getvalue(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
