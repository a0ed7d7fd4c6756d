"""What JAX and torch users pay per op on the GPU (issue 58's targets), one mode per launch:

    JAX_PLATFORMS=cuda aioccl-run --nproc-per-node 2 benchmarks/gpu_frameworks.py jax [--sizes 8,1M]
    torchrun --nproc-per-node 2 benchmarks/gpu_frameworks.py torch

``jax``: a jitted ``x + 1`` call, a jitted call holding one ``jax_ext.all_reduce``, and a jitted
``fori_loop`` of 50 of them, each call followed by ``block_until_ready()``; per op in the loop is
(loop call - ``x + 1`` call) / 50. Beside them, the same op through aioccl's own API on cupy arrays, back to
back with one stream sync per op. ``torch``: ``dist.all_reduce`` of 8 B on a CUDA tensor, 300 calls back to
back then one ``torch.cuda.synchronize()``, backend "aioccl" and Gloo. Every timing is the median over
repeats on the slower rank; every result is checked (exact small integers).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np

REPEATS = 15


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def timed(fn, reps: int = REPEATS) -> float:
    """Median seconds of ``fn()`` over ``reps`` calls, after two warm-ups."""
    fn()
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def jax_row(comm, nbytes: int) -> tuple:
    """One size's timings (seconds, the slower rank's): x + 1, one op, the loop, per op in it, the API op."""
    import cupy as cp
    import jax
    import jax.numpy as jnp

    import jax_ext

    r, n = comm.rank, comm.world_size
    slower = lambda v: float(comm.all_reduce(np.array([v]), "max").wait()[0])  # noqa: E731
    count = max(1, nbytes // 4)
    x = jnp.full((count,), float(r + 1), jnp.float32)
    plus = jax.jit(lambda v: v + 1)
    one = jax.jit(jax_ext.all_reduce)
    # every rank holds ones in the loop, so the sum over n ranks divided by n stays exactly 1
    loop = jax.jit(lambda v: jax.lax.fori_loop(0, 50, lambda i, a: jax_ext.all_reduce(a) / n, v))
    ones = jnp.ones((count,), jnp.float32)
    want = float(n * (n + 1) // 2)
    got = np.asarray(one(x))
    assert np.all(got == want), f"all_reduce {nbytes} B on rank {r}: {got[:4]} != {want}"
    assert np.all(np.asarray(loop(ones)) == 1), f"loop {nbytes} B on rank {r}"
    t_plus = slower(timed(lambda: plus(x).block_until_ready()))
    t_one = slower(timed(lambda: one(x).block_until_ready()))
    t_loop = slower(timed(lambda: loop(ones).block_until_ready(), 7))
    c = cp.full(count, r + 1, np.float32)
    s = cp.cuda.get_current_stream()
    comm.all_reduce(c).wait()
    s.synchronize()
    assert bool(cp.all(c == want)), f"API all_reduce {nbytes} B on rank {r}: {c[:4]}"
    c.fill(0)  # the timed ops below sum zeros: exact however many run

    def api_ops() -> None:
        for _ in range(50):
            comm.all_reduce(c)
            s.synchronize()

    t_api = slower(timed(api_ops, 7)) / 50
    assert not bool(cp.any(c)), f"API chain on rank {r}"
    return nbytes, t_plus, t_one, t_loop, (t_loop - t_plus) / 50, t_api


def jax_mode(sizes: list[int]) -> None:
    import jax_ext

    comm = jax_ext.default_comm()  # the op's communicator, used through aioccl's own (sync) API beside
    rows = [jax_row(comm, nbytes) for nbytes in sizes]
    if comm.rank == 0:
        print("bytes   jit(x+1)   jit(one op)   one - (x+1)   jit(loop 50)   per op in loop   aioccl API op+sync")
        for nb, tp, to, tl, per, ta in rows:
            print(f"{nb:>8} {tp * 1e6:9.1f}us {to * 1e6:11.1f}us {(to - tp) * 1e6:11.1f}us {tl * 1e6:12.1f}us "
                  f"{per * 1e6:14.1f}us {ta * 1e6:16.1f}us", flush=True)


def torch_per_call(dist, torch, group, r: int, n: int) -> float:
    """Seconds per ``dist.all_reduce`` of 8 B on CUDA: 300 back to back, then one synchronize."""
    x = torch.full((2,), float(r + 1), device="cuda")

    def batch() -> None:
        for _ in range(300):
            x.fill_(r + 1)
            dist.all_reduce(x, group=group)
        torch.cuda.synchronize()

    per = timed(batch, 7) / 300
    assert torch.all(x == n * (n + 1) // 2), f"{x} on rank {r}"
    return per


def torch_mode() -> None:
    import torch
    import torch.distributed as dist

    import aioccl  # noqa: F401  (registers the backend)
    from aioccl import lowlevel

    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dist.init_process_group(backend="aioccl")
    r, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    out = {}
    try:  # the backend's communicator, to count what the GPU lane ran
        comm = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cuda")).comm
    except (AttributeError, RuntimeError):
        comm = None
    for name, group in (("aioccl", None), ("gloo", gloo)):
        t = torch.tensor([torch_per_call(dist, torch, group, r, n)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
        out[name] = float(t[0])
    if r == 0:
        print(f"torch dist.all_reduce 8 B on CUDA, per call (300 back to back + one sync): "
              f"aioccl {out['aioccl'] * 1e6:.1f}us, Gloo {out['gloo'] * 1e6:.1f}us; the GPU lane ran "
              f"{lowlevel.gpu_lane_ran(comm) if comm is not None else '?'} of aioccl's {9 * 300} calls", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "jax"
    if mode == "jax":
        sizes = [8, 1 << 20]
        if "--sizes" in sys.argv:
            sizes = [parse_size(s) for s in sys.argv[sys.argv.index("--sizes") + 1].split(",")]
        jax_mode(sizes)
    else:
        torch_mode()
