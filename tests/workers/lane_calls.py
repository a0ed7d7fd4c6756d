"""Every collective's forms through the CPU lane (native/src/py/lane_calls.c), exact on every element.

Each form runs three times: the first call goes the general way and teaches the lane, the next two run in C.
Outputs are poisoned first; numpy arrays, then CPU torch tensors (through their numpy views). Prints
``LANE_CALLS OK rank=<r> checks=<k> ran=<lane ops> of=<calls>`` and, with LANE_CALLS_EXPECT=1, fails when a
form the lane should take never ran there.
"""

from __future__ import annotations

import asyncio
import os
import sys

import numpy as np

import aioccl

comm: aioccl.Communicator
r = n = 0
checks = 0
untaken: list[str] = []


def data(rank: int, shape: tuple[int, ...], dt: str, salt: int = 0) -> np.ndarray:
    base = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    return ((base * 3 + rank * 7 + salt) % 23 - 11).astype(dt)


def poison(shape: tuple[int, ...], dt: str) -> np.ndarray:
    return np.full(shape, -99, dt)


def same(got, want, what: str) -> None:
    global checks
    if want is None:
        assert got is None, f"{what} on rank {r}: {got!r}, want None"
    else:
        got = np.asarray(got)
        assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want), \
            f"{what} on rank {r}:\n{got}\nwant\n{want}"
    checks += 1


def every(shape: tuple[int, ...], dt: str, salt: int = 0) -> list[np.ndarray]:
    return [data(q, shape, dt, salt) for q in range(n)]


def total(xs: list[np.ndarray], dt: str) -> np.ndarray:
    return np.sum(np.stack(xs).astype(np.float64), 0).astype(dt)


def forms(dt: str) -> list[tuple[str, object]]:
    """(name, call) pairs; each call issues the op and checks its result and its outputs."""
    async def ar_out():
        x, y = data(r, (4, 5), dt), poison((4, 5), dt)
        got = (await comm.all_reduce(x, out=y))
        assert got is y
        same(y, total(every((4, 5), dt), dt), "all_reduce out=")
        same(x, data(r, (4, 5), dt), "all_reduce out= leaves x")

    async def ar_max_out():
        x, y = data(r, (7,), dt), poison((7,), dt)
        same((await comm.all_reduce(x, "max", out=y)), np.max(every((7,), dt), 0), "all_reduce max out=")

    async def bcast():
        x = data(r, (9,), dt)
        got = (await comm.broadcast(x, root=n - 1))
        assert got is x
        same(x, data(n - 1, (9,), dt), "broadcast in place")

    async def bcast_out():
        y = poison((3, 3), dt)
        assert (await comm.broadcast(data(r, (3, 3), dt), root=0, out=y)) is y
        same(y, data(0, (3, 3), dt), "broadcast out=")

    async def ag_out():
        y = poison((2 * n, 3), dt)
        assert (await comm.all_gather(data(r, (2, 3), dt), out=y)) is y
        same(y, np.concatenate(every((2, 3), dt)), "all_gather out=")

    async def ag_fresh():
        same((await comm.all_gather(data(r, (5,), dt))), np.concatenate(every((5,), dt)), "all_gather fresh")

    async def ag_block():  # x is out's block `rank` (NCCL's in place)
        y = poison((3 * n,), dt)
        y[3 * r:3 * r + 3] = data(r, (3,), dt)
        assert (await comm.all_gather(y[3 * r:3 * r + 3], out=y)) is y
        same(y, np.concatenate(every((3,), dt)), "all_gather in place")

    async def rs_out():
        y = poison((2, 2), dt)
        assert (await comm.reduce_scatter(data(r, (2 * n, 2), dt), out=y)) is y
        same(y, total(every((2 * n, 2), dt), dt)[2 * r:2 * r + 2], "reduce_scatter out=")

    async def red():
        x = data(r, (6,), dt)
        got = (await comm.reduce(x, root=0, op="min"))
        same(got, np.min(every((6,), dt), 0) if r == 0 else None, "reduce")

    async def red_out():
        y = poison((6,), dt)
        got = (await comm.reduce(data(r, (6,), dt), root=n - 1, out=y))
        same(got, total(every((6,), dt), dt) if r == n - 1 else None, "reduce out=")
        if r != n - 1:
            same(y, poison((6,), dt), "reduce out= untouched off the root")

    async def gat():
        got = (await comm.gather(data(r, (4,), dt), root=0))
        same(got, np.concatenate(every((4,), dt)) if r == 0 else None, "gather")

    async def sca():
        y = poison((2,), dt)
        x = data(0, (2 * n,), dt, 5) if r == 0 else None
        assert (await comm.scatter(x, root=0, out=y)) is y
        same(y, data(0, (2 * n,), dt, 5)[2 * r:2 * r + 2], "scatter out=")

    async def a2a():
        y = poison((2 * n,), dt)
        assert (await comm.all_to_all(data(r, (2 * n,), dt), out=y)) is y
        same(y, np.concatenate([data(q, (2 * n,), dt)[2 * r:2 * r + 2] for q in range(n)]), "all_to_all out=")

    async def a2a_in_place():
        x = data(r, (n, 2), dt)
        assert (await comm.all_to_all(x)) is x
        same(x, np.concatenate([data(q, (n, 2), dt)[r:r + 1] for q in range(n)]), "all_to_all in place")

    async def scan():
        x = data(r, (5,), dt)
        assert (await comm.scan(x)) is x
        same(x, total(every((5,), dt)[:r + 1], dt), "scan in place")

    async def scan_out():
        y = poison((5,), dt)
        assert (await comm.scan(data(r, (5,), dt), "max", out=y)) is y
        same(y, np.max(every((5,), dt)[:r + 1], 0), "scan max out=")

    async def barrier():
        assert (await comm.barrier()) is None

    return [("all_reduce out=", ar_out), ("all_reduce max out=", ar_max_out), ("broadcast", bcast),
            ("broadcast out=", bcast_out), ("all_gather out=", ag_out), ("all_gather fresh", ag_fresh),
            ("all_gather in place", ag_block), ("reduce_scatter out=", rs_out), ("reduce", red),
            ("reduce out=", red_out), ("gather", gat), ("scatter", sca), ("all_to_all out=", a2a),
            ("all_to_all in place", a2a_in_place), ("scan", scan), ("scan out=", scan_out), ("barrier", barrier)]


async def main() -> None:
    global comm, r, n
    comm = await aioccl.init(timeout=30)  # the inline engine: ops run on this thread, no lock to borrow
    r, n = comm.rank, comm.world_size
    lane = comm._cpu.native
    ran_now = (lambda: lane.ran) if lane is not None else (lambda: 0)  # (AIOCCL_NATIVE=0: no lane)
    calls = 0
    for dt in ("float32", "int32", "float64", "int8"):
        for name, call in forms(dt):
            ran = 0
            for _ in range(3):
                before = ran_now()
                await call()
                calls += 1
                ran += ran_now() - before
            if ran == 0:
                untaken.append(f"{name} {dt}")

    # CPU torch tensors: the lane runs on their numpy views and gives the tensors back
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        for _ in range(3):
            x = torch.arange(4, dtype=torch.float32) + r
            y = torch.full((4 * n,), -99.0)
            assert (await comm.all_gather(x, out=y)) is y
            same(y.numpy(), np.concatenate([np.arange(4, dtype=np.float32) + q for q in range(n)]), "torch all_gather")
            z = torch.full((4,), -99.0)
            assert (await comm.broadcast(x, root=0, out=z)) is z
            same(z.numpy(), np.arange(4, dtype=np.float32), "torch broadcast")
            calls += 2

    print(f"LANE_CALLS OK rank={r} checks={checks} ran={ran_now()} of={calls}", flush=True)
    if os.environ.get("LANE_CALLS_EXPECT") == "1" and untaken:
        print(f"LANE_CALLS UNTAKEN rank={r}: {untaken}", flush=True)
        sys.exit(1)
    await comm.close()


asyncio.run(main())
