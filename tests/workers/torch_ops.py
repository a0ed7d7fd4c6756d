"""Every op on torch CPU tensors: results land in the caller's tensors (in place), fresh outputs are tensors.

Run as: aioccl-run --nproc-per-node N tests/workers/torch_ops.py
"""

from __future__ import annotations

import asyncio
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
import aioccl  # noqa: E402

from _check import Checker, data, poison, reduced  # noqa: E402

DTYPES = [torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
          torch.float64]
COUNTS = [0, 1, 37, 3000]


def t(a: np.ndarray, like: torch.dtype) -> torch.Tensor:
    """The exact numpy data as a tensor of dtype ``like`` (bfloat16 goes through float32: exact for small ints)."""
    return torch.from_numpy(np.ascontiguousarray(a).astype(np.float64)).to(like)


def npy(x: torch.Tensor) -> np.ndarray:
    return x.to(torch.float64).numpy()


async def run(comm: aioccl.Communicator, ck: Checker) -> None:
    n, r = comm.world_size, comm.rank
    f8 = np.float64
    for dt in DTYPES:
        for count in COUNTS:
            tag = f"{dt} count={count}"
            x = t(data(r, count, f8), dt)
            got = await comm.all_reduce(x)
            ck.true(f"all_reduce {tag} returns the tensor", got is x)
            ck.same(f"all_reduce {tag}", npy(x), reduced(n, count, f8, "sum"))
            x = t(data(r, count, f8, "max"), dt)
            out = t(poison(count, f8), dt)
            got = await comm.all_reduce(x, op="max", out=out)
            ck.true(f"all_reduce max {tag} returns out", got is out)
            ck.same(f"all_reduce max {tag}", npy(out), reduced(n, count, f8, "max"))
            for root in range(n):
                b = t(data(root, count, f8) if r == root else poison(count, f8), dt)
                got = await comm.broadcast(b, root=root)
                ck.true(f"broadcast root={root} {tag} in place", got is b)
                ck.same(f"broadcast root={root} {tag}", npy(b), data(root, count, f8))
                x = t(data(r, count, f8), dt)
                got = await comm.reduce(x, root=root)
                if r == root:
                    ck.same(f"reduce root={root} {tag}", npy(got), reduced(n, count, f8, "sum"))
                else:
                    ck.true(f"reduce root={root} {tag} None off-root", got is None)
                out = t(poison(n * count, f8), dt)
                got = await comm.gather(t(data(r, count, f8), dt), root=root, out=out if r == root else None)
                if r == root:
                    ck.true(f"gather root={root} {tag} returns out", got is out)
                    ck.same(f"gather root={root} {tag}", npy(out),
                            np.concatenate([data(j, count, f8) for j in range(n)]))
                src = t(np.arange(n * count) % 9, dt)
                out = t(poison(count, f8), dt)
                got = await comm.scatter(src if r == root else None, root=root, out=out)
                ck.same(f"scatter root={root} {tag}", npy(out), (np.arange(n * count) % 9)[r * count:(r + 1) * count]
                        .astype(f8))
            got = await comm.all_gather(t(data(r, count, f8), dt))
            ck.true(f"all_gather {tag} fresh output is a tensor of {dt}",
                    isinstance(got, torch.Tensor) and got.dtype == dt)
            ck.same(f"all_gather {tag}", npy(got), np.concatenate([data(j, count, f8) for j in range(n)]))
            x = t(data(r, n * count, f8), dt)
            got = await comm.reduce_scatter(x)
            ck.true(f"reduce_scatter {tag} result is a tensor", isinstance(got, torch.Tensor))
            ck.same(f"reduce_scatter {tag}", npy(got), reduced(n, n * count, f8, "sum")[r * count:(r + 1) * count])
            ck.true(f"reduce_scatter {tag} result lies in x", count == 0 or got.data_ptr() == x[r * count:].data_ptr())
            a2a = [(np.arange(n * count) + 10 * j) % 100 for j in range(n)]
            x = t(a2a[r], dt)
            got = await comm.all_to_all(x)
            ck.true(f"all_to_all {tag} in place", got is x)
            ck.same(f"all_to_all {tag}", npy(x),
                    np.concatenate([a2a[j][r * count:(r + 1) * count] for j in range(n)]).astype(f8))
            # ring of sends: from r-1, to r+1
            out = t(poison(count, f8), dt)
            works = [comm.irecv(out, (r - 1) % n, tag=7), comm.isend(t(data(r, count, f8), dt), (r + 1) % n, tag=7)]
            await asyncio.gather(*works)
            ck.same(f"send/recv {tag}", npy(out), data((r - 1) % n, count, f8))
    # a parameter that requires grad is broadcast in place, invisibly to autograd (like torch.distributed)
    w = torch.nn.Parameter(torch.full((4, 3), float(r)))
    got = await comm.broadcast(w, root=n - 1)
    ck.true("broadcast a Parameter returns it", got is w and w.requires_grad)
    ck.same("broadcast a Parameter", w.detach().numpy(), np.full((4, 3), n - 1, np.float32))
    await comm.barrier()


async def main() -> None:
    comm = await aioccl.init(timeout=60)
    ck = Checker(comm.rank)
    await run(comm, ck)
    await comm.close()
    ck.finish(f"torch n={comm.world_size} transport={comm.transport}")


if __name__ == "__main__":
    asyncio.run(main())
