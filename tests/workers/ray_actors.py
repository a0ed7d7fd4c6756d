"""Actors for tests/test_ray.py: members of aioccl groups on a local Ray cluster.

``Member`` (a sync actor) uses ``ray.util.collective`` with the "AIOCCL" backend; ``AsyncMember`` (an async
actor) uses aioccl's own awaitable communicators (``aioccl.ray.init_group``). Their checks return what was
wrong (an empty list: every element right), so a test asks every actor once and compares nothing by chance.
Data are small integers, exact in every dtype: (i + rank) % 3 + 1, whose products over 4 ranks stay <= 81.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import ray
import ray.util.collective as col
import torch
from ray.util.collective.types import RecvOptions, ReduceOp, SendOptions

import aioccl.ray  # the documented way: every actor imports it (again: harmless)

DTYPES = (np.uint8, np.float16, np.float32, np.float64)
OPS = {ReduceOp.SUM: np.add, ReduceOp.PRODUCT: np.multiply, ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum}
POISON = 99


def pattern(rank: int, count: int, dtype: Any, salt: int = 0) -> np.ndarray:
    return ((np.arange(count) + rank + salt) % 3 + 1).astype(dtype)


def as_lib(x: np.ndarray, lib: str) -> Any:
    return torch.from_numpy(x) if lib == "torch" else x


def view(x: Any) -> np.ndarray:
    return x.numpy() if isinstance(x, torch.Tensor) else x


def over(fn: Any, arrays: list[np.ndarray]) -> np.ndarray:
    """``fn`` over ranks in the arrays' own dtype (numpy's reduce would widen small integers)."""
    return fn.reduce(np.stack(arrays), axis=0, dtype=arrays[0].dtype)  # type: ignore[no-any-return]


def wrong(what: str, got: Any, want: np.ndarray) -> list[str]:
    got = view(got)
    if got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want):
        return []
    bad = int(np.count_nonzero(got != want)) if got.shape == want.shape else -1
    return [f"{what}: {bad} elements wrong, first {got.reshape(-1)[:4]} want {want.reshape(-1)[:4]}"]


@ray.remote
class Member:
    """A sync actor in ray.util.collective groups with the AIOCCL backend."""

    def join(self, world_size: int, rank: int, name: str, aioccl_timeout: str = "") -> tuple[int, int, int]:
        """Form group ``name``; ``aioccl_timeout``: AIOCCL_TIMEOUT for it (as the actor's environment would set it)."""
        saved = os.environ.get("AIOCCL_TIMEOUT")
        if aioccl_timeout:
            os.environ["AIOCCL_TIMEOUT"] = aioccl_timeout
        try:
            col.init_collective_group(world_size, rank, backend="AIOCCL", group_name=name)
        finally:
            if aioccl_timeout and saved is None:
                del os.environ["AIOCCL_TIMEOUT"]
            elif aioccl_timeout:
                os.environ["AIOCCL_TIMEOUT"] = saved  # type: ignore[assignment]
        return col.get_rank(name), col.get_collective_group_size(name), os.getpid()

    def leave(self, name: str) -> bool:
        col.destroy_collective_group(name)
        return col.is_group_initialized(name)

    def joined(self, name: str) -> bool:
        return col.is_group_initialized(name)

    def ones(self, name: str) -> float:
        """An allreduce of ones (the group's size, if it is formed here or declared from the driver)."""
        x = np.ones(3, np.float32)
        col.allreduce(x, name)
        return float(x[0]) if (x == x[0]).all() else -1.0

    def every_op(self, name: str) -> list[str]:
        """Every BaseGroup op, every dtype and reduction, numpy and torch (mixed where a call takes several)."""
        n, r = col.get_collective_group_size(name), col.get_rank(name)
        bad: list[str] = []
        for dtype in DTYPES:
            for count in (1, 1000):
                lib = "torch" if (count + DTYPES.index(dtype)) % 2 else "numpy"
                for op, fn in OPS.items():
                    x = pattern(r, count, dtype)
                    col.allreduce(as_lib(x, lib), name, op)
                    bad += wrong(f"allreduce {op.name} {dtype.__name__} x{count} {lib}", x,
                                 over(fn, [pattern(k, count, dtype) for k in range(n)]))
                for root in range(n):
                    x = pattern(root, count, dtype) if r == root else np.full(count, POISON, dtype)
                    col.broadcast(as_lib(x, lib), root, name)
                    bad += wrong(f"broadcast root {root} {dtype.__name__} {lib}", x, pattern(root, count, dtype))
                    x = pattern(r, count, dtype)
                    col.reduce(as_lib(x, lib), root, name, ReduceOp.MAX)
                    want = over(np.maximum, [pattern(k, count, dtype) for k in range(n)]) if r == root else \
                        pattern(r, count, dtype)
                    bad += wrong(f"reduce MAX to {root} {dtype.__name__} {lib}", x, want)
                other = "numpy" if lib == "torch" else "torch"
                outs = [np.full(count, POISON, dtype) for _ in range(n)]
                col.allgather([as_lib(o, other) for o in outs], as_lib(pattern(r, count, dtype), lib), name)
                for k in range(n):
                    bad += wrong(f"allgather [{k}] {dtype.__name__} {lib}/{other}", outs[k], pattern(k, count, dtype))
                ins = [pattern(r, count, dtype, salt=k) for k in range(n)]
                out = np.full(count, POISON, dtype)
                col.reducescatter(as_lib(out, lib), [as_lib(x, other) for x in ins], name)
                bad += wrong(f"reducescatter {dtype.__name__} {lib}/{other}", out,
                             over(np.add, [pattern(k, count, dtype, salt=r) for k in range(n)]))
                bad += wrong("reducescatter leaves its inputs", ins[-1], pattern(r, count, dtype, salt=n - 1))
        big = pattern(r, 1 << 20, np.float32)  # 2**20 elements
        col.allreduce(big, name)
        bad += wrong("allreduce 2**20 float32", big, over(np.add, [pattern(k, 1 << 20, np.float32) for k in range(n)]))
        bad += self.ring(name, n, r)
        col.barrier(name)
        return bad

    def ring(self, name: str, n: int, r: int) -> list[str]:
        """send/recv around the ring (even ranks send first); n_elements through the group's own options."""
        bad: list[str] = []
        g = col.get_group_handle(name)
        for count, part in ((5, 0), (1000, 0), (1000, 10), (1 << 18, 0)):
            got = np.full(count, POISON, np.int32)
            mine = pattern(r, count, np.int32)
            so, ro = SendOptions(), RecvOptions()
            so.dst_rank, so.n_elements, ro.src_rank, ro.n_elements = (r + 1) % n, part, (r - 1) % n, part
            for sending in (True, False) if r % 2 == 0 else (False, True):
                if sending and part:
                    g.send([torch.from_numpy(mine)], so)
                elif sending:
                    col.send(torch.from_numpy(mine), (r + 1) % n, name)
                else:
                    g.recv([got], ro) if part else col.recv(got, (r - 1) % n, name)
            want = pattern((r - 1) % n, count, np.int32)
            if part:
                want[part:] = POISON
            bad += wrong(f"send/recv {count} n_elements={part}", got, want)
        return bad

    def from_the_store(self, name: str, kept: list[Any], lib: str) -> dict[str, Any]:
        """Every op that writes into a tensor, on tensors the driver handed this actor (``kept``: Ray delivers
        numpy arguments zero-copy from its object store, read-only): exact, in place on those very tensors, and
        a ReadOnlyArrayWarning for each read-only one written, naming this file as the call site."""
        n, r = col.get_collective_group_size(name), col.get_rank(name)
        count = view(kept[0]).size
        arrived_read_only = [not view(t).flags.writeable for t in kept]
        ptrs = [view(t).__array_interface__["data"][0] for t in kept]
        bad: list[str] = []
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            x = kept[0]  # all ones from the driver: allreduce, then broadcast from rank 1, then reduce to 0
            col.allreduce(x, name)
            bad += wrong("allreduce", x, np.full(count, n, np.float32))
            if r == 1:
                col.broadcast(pattern(r, count, np.float32), 1, name)
            else:
                col.broadcast(x, 1, name)
                bad += wrong("broadcast", x, pattern(1, count, np.float32))
            y = kept[1]
            col.reduce(y, 0, name)
            bad += wrong("reduce", y, np.full(count, n, np.float32) if r == 0 else np.ones(count, np.float32))
            outs = kept[2:2 + n]
            col.allgather(outs, pattern(r, count, np.float32), name)
            for k in range(n):
                bad += wrong(f"allgather [{k}]", outs[k], pattern(k, count, np.float32))
            z = kept[2 + n]
            col.reducescatter(z, [pattern(r, count, np.float32, salt=k) for k in range(n)], name)
            bad += wrong("reducescatter", z, over(np.add, [pattern(k, count, np.float32, salt=r) for k in range(n)]))
            w = kept[3 + n]
            if r == 0:
                col.send(pattern(0, count, np.float32), 1, name)
            else:
                col.recv(w, 0, name)
                bad += wrong("recv", w, pattern(0, count, np.float32))
        moved = [i for i, t in enumerate(kept) if view(t).__array_interface__["data"][0] != ptrs[i]]
        warned = [(str(m.message).split(" ")[0], os.path.basename(m.filename)) for m in seen
                  if m.category is aioccl.ray.ReadOnlyArrayWarning]
        return {"read_only": arrived_read_only, "bad": bad + [f"tensors {moved} moved"] * bool(moved),
                "warned": warned}

    def mismatches(self, name: str) -> list[tuple[str, str, bool, bool]]:
        """Calls refused before anything is sent: (call, the error's class, a RuntimeError?, aioccl's
        InvalidArgument?). A list of the wrong length is refused by ray.util.collective itself, for every
        backend (a RuntimeError); a shape or dtype that does not match by this backend. The group stays usable."""
        n = col.get_collective_group_size(name)
        x = np.ones(10, np.float32)
        cases = {
            "allgather: a list of the wrong length": lambda: col.allgather([x.copy() for _ in range(n + 1)], x, name),
            "reducescatter: a list of the wrong length": lambda: col.reducescatter(x, [x] * (n - 1), name),
            "allgather: a tensor of another shape": lambda: col.allgather([np.ones(5, np.float32)] * n, x, name),
            "allgather: a tensor of another dtype": lambda: col.allgather([np.ones(10, np.float64)] * n, x, name),
            "reducescatter: an output of another shape": lambda: col.reducescatter(np.ones(5, np.float32),
                                                                                   [x] * n, name),
            "reducescatter: inputs of another dtype": lambda: col.reducescatter(x, [np.ones(10, np.int32)] * n,
                                                                                name),
        }
        out = []
        for what, call in cases.items():
            try:
                call()
                out.append((what, "no error", False, False))
            except Exception as e:  # noqa: BLE001 - what was raised is the answer
                out.append((what, type(e).__name__, isinstance(e, RuntimeError),
                            isinstance(e, aioccl.InvalidArgument)))
        col.allreduce(x, name)
        out.append(("then an allreduce", "exact" if (x == n).all() else "wrong", True, True))
        return out

    def mismatched_allgather(self, name: str) -> None:
        """The same refusal left to Ray: the driver's ray.get sees it."""
        n = col.get_collective_group_size(name)
        col.allgather([np.ones(5, np.float32)] * n, np.ones(10, np.float32), name)

    def across_a_kill(self, name: str) -> tuple[str, int, float]:
        """A ray.util.collective call waiting for a member that is killed meanwhile: its error, the rank it names,
        and when it was raised (``time.time()``: the driver knows when it killed)."""
        try:
            col.allreduce(np.ones(4), name)
            return "no error", -1, time.time()
        except aioccl.PeerLost as e:
            return type(e).__name__ + ("/RuntimeError" if isinstance(e, RuntimeError) else ""), e.rank, time.time()

    def every_op_on_gpu(self, name: str) -> list[str]:
        """The list-taking ops and the others on cupy arrays (the stand-in, tests/fakecupy, where no GPU is):
        aioccl's GPU path behind Ray's calls, results read back to the host (which waits for their stream)."""
        import cupy

        n, r = col.get_collective_group_size(name), col.get_rank(name)
        bad: list[str] = []
        for dtype in (np.float32, np.int64):
            x = cupy.asarray(pattern(r, 1000, dtype))
            col.allreduce(x, name, ReduceOp.MAX)
            bad += wrong(f"gpu allreduce {dtype.__name__}", cupy.asnumpy(x),
                         over(np.maximum, [pattern(k, 1000, dtype) for k in range(n)]))
            x = cupy.asarray(pattern(r, 1000, dtype) if r == 1 else np.full(1000, POISON, dtype))
            col.broadcast(x, 1, name)
            bad += wrong(f"gpu broadcast {dtype.__name__}", cupy.asnumpy(x), pattern(1, 1000, dtype))
            outs = [cupy.asarray(np.full(10, POISON, dtype)) for _ in range(n)]
            col.allgather(outs, cupy.asarray(pattern(r, 10, dtype)), name)
            for k in range(n):
                bad += wrong(f"gpu allgather [{k}]", cupy.asnumpy(outs[k]), pattern(k, 10, dtype))
            out = cupy.asarray(np.full(10, POISON, dtype))
            col.reducescatter(out, [cupy.asarray(pattern(r, 10, dtype, salt=k)) for k in range(n)], name)
            bad += wrong(f"gpu reducescatter {dtype.__name__}", cupy.asnumpy(out),
                         over(np.add, [pattern(k, 10, dtype, salt=r) for k in range(n)]))
        return bad

    def alone(self, name: str) -> tuple[str, list[int], float]:
        """An allreduce that the other ranks never call: the error, the ranks it names, how long it took."""
        t = time.monotonic()
        try:
            col.allreduce(np.ones(4), name)
            return "no error", [], time.monotonic() - t
        except aioccl.CollectiveTimeout as e:
            kind = type(e).__name__ + ("/RuntimeError" if isinstance(e, RuntimeError) else "")
            return kind, e.waiting_for, time.monotonic() - t

    def time_allreduce(self, name: str, count: int, reps: int) -> float:
        """Median seconds per ray.util.collective.allreduce call."""
        x = np.ones(count, np.float32)
        col.allreduce(x, name)
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            col.allreduce(x, name)
            times.append(time.perf_counter() - t)
        return float(np.median(times))


@ray.remote
class AsyncMember:
    """An async actor with aioccl's own awaitable communicators."""

    def __init__(self) -> None:
        self.comms: dict[str, Any] = {}

    async def pid(self) -> int:
        return os.getpid()

    async def join(self, world_size: int | None, rank: int | None, name: str) -> tuple[int, int]:
        comm = await aioccl.ray.init_group(world_size, rank, name, timeout=30)
        self.comms[name] = comm
        return comm.rank, comm.world_size

    async def all_reduce(self, name: str, count: int = 4) -> list[str]:
        comm = self.comms[name]
        x = pattern(comm.rank, count, np.int64)
        await comm.all_reduce(x)
        return wrong("all_reduce", x, over(np.add, [pattern(k, count, np.int64) for k in range(comm.world_size)]))

    async def late_ticks(self, name: str, hold_s: float) -> float:
        """Await an all_reduce that the last rank joins ``hold_s`` late while a 1 ms timer runs here: how late
        the timer fired at worst, in seconds (a loop blocked by the wait would show ``hold_s``)."""
        comm = self.comms[name]
        if comm.rank == comm.world_size - 1:
            await asyncio.sleep(hold_s)
            await comm.all_reduce(np.ones(4))
            return 0.0
        worst, stop = 0.0, asyncio.Event()

        async def ticker() -> None:
            nonlocal worst
            while not stop.is_set():
                t = time.perf_counter()
                await asyncio.sleep(0.001)
                worst = max(worst, time.perf_counter() - t - 0.001)

        task = asyncio.create_task(ticker())
        await comm.all_reduce(np.ones(4))
        stop.set()
        await task
        return worst

    async def across_a_kill(self, name: str) -> tuple[str, int, float, list[str]]:
        """An all_reduce waiting for a rank that is killed meanwhile: its error, the rank it names, when it was
        raised (``time.time()``); then shrink() and an all_reduce among the survivors."""
        comm = self.comms[name]
        try:
            await comm.all_reduce(np.ones(4))
            return "no error", -1, time.time(), []
        except aioccl.PeerLost as e:
            err, who, took = type(e).__name__, e.rank, time.time()
        small = await comm.shrink()
        self.comms[name] = small
        x = np.full(3, small.rank + 1, np.int64)
        await small.all_reduce(x)
        n = small.world_size
        return err, who, took, wrong("all_reduce after shrink", x, np.full(3, n * (n + 1) // 2, np.int64))

    async def blocking_in_loop(self, world_size: int, rank: int, name: str) -> list[str]:
        """ray.util.collective's blocking calls made on this actor's event loop: they block it, never deadlock."""
        col.init_collective_group(world_size, rank, backend="AIOCCL", group_name=name)
        x = np.full(8, rank + 1, np.float64)
        col.allreduce(x, name)
        col.destroy_collective_group(name)
        return wrong("allreduce on the loop", x, np.full(8, world_size * (world_size + 1) / 2))

    async def close(self, name: str) -> None:
        await self.comms.pop(name).close()


# -- Ray Train: one DDP step over aioccl (TorchConfig(backend="aioccl")) ------------------------------------------
def model(torch: Any) -> Any:
    """Integer weights: one SGD step with lr 0.5 on integer data is exact in float32."""
    m = torch.nn.Linear(4, 2)
    with torch.no_grad():
        m.weight.copy_(torch.arange(8, dtype=torch.float32).reshape(2, 4) % 3)
        m.bias.copy_(torch.tensor([1.0, -1.0]))
    return m


def batch(torch: Any, rank: int) -> Any:
    return (torch.arange(8, dtype=torch.float32).reshape(2, 4) + rank) % 4


def train_step(config: dict[str, Any]) -> None:
    """Ray Train's loop on each worker: one step, its parameters written to ``config["out"]``."""
    import torch.distributed as dist
    from ray.train.torch import prepare_model

    m = prepare_model(model(torch))
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    rank = dist.get_rank()
    m(batch(torch, rank)).sum().backward()
    opt.step()
    params = [p.detach().tolist() for p in m.parameters()]
    Path(config["out"], f"rank{rank}.json").write_text(json.dumps({"backend": dist.get_backend(), "params": params}))
