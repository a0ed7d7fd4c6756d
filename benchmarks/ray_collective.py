"""ray.util.collective on Ray actors: aioccl's "AIOCCL" backend against Ray's GLOO backend, same actors, one run.

    python benchmarks/ray_collective.py [--actors 4] [--sizes 8,1M] [--iters 200] [--repeats 3] [--out docs/bench/ray]

One local Ray cluster; ``--actors`` actors each join a GLOO group and an AIOCCL group. Per repeat, op and size,
each backend in turn (rotating order): one call on exact data checked element by element, a few warm-up calls,
then ``--iters`` calls back to back, each timed inside the actor; a run's figure is the median per-call time
of the slowest actor. The table gives the median over repeats and GLOO's time over aioccl's. Sizes are bytes of
float32 (block-wise ops: the whole buffer). Then, through aioccl's awaitable API in async actors
(``aioccl.ray.init_group``): how late a 1 ms asyncio timer in the same actor fires at worst while an all_reduce
waits 0.3 s for the last actor. Writes ``ray_collective.json`` and ``ray_collective.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import ray
import ray.util.collective as col

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _side_by_side import report  # noqa: E402

OPS = ("allreduce", "broadcast", "allgather", "reducescatter")


def parse_size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20}.get(s[-1:], 1)
    return int(s[:-1] if mult > 1 else s) * mult


@ray.remote
class Member:
    def __init__(self, rank: int, n: int) -> None:
        import aioccl.ray  # noqa: F401  (registers the backend in this actor)

        self.rank, self.n = rank, n

    def join(self) -> None:
        col.init_collective_group(self.n, self.rank, backend="GLOO", group_name="gloo")
        col.init_collective_group(self.n, self.rank, backend="AIOCCL", group_name="aioccl")

    def run(self, group: str, op: str, nbytes: int, iters: int) -> float:
        """Median seconds per call of ``op`` on ``nbytes`` of float32, after one checked call."""
        count, n, r = max(1, nbytes // 4), self.n, self.rank
        x = np.full(count, r + 1, np.float32)
        if op == "allreduce":
            call, check = (lambda: col.allreduce(x, group)), (lambda: (x == n * (n + 1) / 2).all())
        elif op == "broadcast":
            call, check = (lambda: col.broadcast(x, 0, group)), (lambda: (x == 1).all())
        elif op == "allgather":
            per = max(1, count // n)
            mine, outs = np.full(per, r + 1, np.float32), [np.zeros(per, np.float32) for _ in range(n)]
            call = lambda: col.allgather(outs, mine, group)  # noqa: E731
            check = lambda: all((o == k + 1).all() for k, o in enumerate(outs))  # noqa: E731
        else:
            per = max(1, count // n)
            ins, out = [np.full(per, r + 1, np.float32) for _ in range(n)], np.zeros(per, np.float32)
            call, check = (lambda: col.reducescatter(out, ins, group)), (lambda: (out == n * (n + 1) / 2).all())
        call()
        if not check():
            raise SystemExit(f"{group} {op} {nbytes} B: wrong result on rank {r}")
        for _ in range(5):
            call()
        col.barrier(group)
        times = []
        for _ in range(iters):
            t = time.perf_counter()
            call()
            times.append(time.perf_counter() - t)
        return float(np.median(times))


@ray.remote
class AsyncMember:
    async def lateness(self, n: int, rank: int, hold_s: float, rounds: int) -> float:
        """Worst lateness (seconds) of a 1 ms timer while an all_reduce waits ``hold_s`` for the last rank."""
        import aioccl.ray

        comm = await aioccl.ray.init_group(n, rank, "lateness")
        worst = 0.0
        for _ in range(rounds):
            if rank == n - 1:
                await asyncio.sleep(hold_s)
                await comm.all_reduce(np.ones(4))
                continue
            stop = asyncio.Event()

            async def ticker(stop: asyncio.Event) -> None:
                nonlocal worst
                while not stop.is_set():
                    t = time.perf_counter()
                    await asyncio.sleep(0.001)
                    worst = max(worst, time.perf_counter() - t - 0.001)

            task = asyncio.create_task(ticker(stop))
            await comm.all_reduce(np.ones(4))
            stop.set()
            await task
        await comm.close()
        return worst


def fmt(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB" if nbytes >= 1 << 10 else f"{nbytes} B"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--actors", type=int, default=4)
    p.add_argument("--sizes", default="8,1M")
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="")
    a = p.parse_args()
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    folder = tempfile.mkdtemp(prefix="r")  # short: Ray's Unix sockets live under it
    ray.init(num_cpus=max(8, 2 * a.actors), include_dashboard=False, object_store_memory=80 << 20, _temp_dir=folder,
             log_to_driver=False)
    members = [Member.remote(r, a.actors) for r in range(a.actors)]
    ray.get([m.join.remote() for m in members])
    points = []
    for rep in range(a.repeats):
        for op in OPS:
            for nbytes in sizes:
                for group in (("aioccl", "gloo") if rep % 2 == 0 else ("gloo", "aioccl")):
                    per = max(ray.get([m.run.remote(group, op, nbytes, a.iters) for m in members]))
                    points.append({"backend": group, "op": op, "bytes": nbytes, "repeat": rep, "us": per * 1e6})
                    print(f"repeat {rep} {op} {fmt(nbytes)} {group}: {per * 1e6:.1f} us", flush=True)
    late_actors = [AsyncMember.remote() for _ in range(a.actors)]
    late = ray.get([m.lateness.remote(a.actors, r, 0.3, 5) for r, m in enumerate(late_actors)])
    ray.shutdown()
    shutil.rmtree(folder, ignore_errors=True)
    lines = [f"# ray.util.collective on {a.actors} actors: aioccl (AIOCCL) vs Ray's GLOO backend", "",
             f"Median over {a.repeats} repeats of the per-call median on the slowest actor, {a.iters} calls, float32, "
             f"the same actors in one run; `python benchmarks/ray_collective.py --actors {a.actors}`.", "",
             "| op | size | aioccl us | GLOO us | GLOO / aioccl |", "|---|---|---|---|---|"]
    for op in OPS:
        for nbytes in sizes:
            us = {g: statistics.median(pt["us"] for pt in points if pt["backend"] == g and pt["op"] == op and
                                       pt["bytes"] == nbytes) for g in ("aioccl", "gloo")}
            lines.append(f"| {op} | {fmt(nbytes)} | {us['aioccl']:.1f} | {us['gloo']:.1f} | "
                         f"{us['gloo'] / us['aioccl']:.1f}x |")
    lines += ["", f"Through `aioccl.ray.init_group` in async actors, a 1 ms asyncio timer fired at most "
              f"{max(late) * 1e3:.2f} ms late while an all_reduce waited 0.3 s for the last actor (5 rounds)."]
    report(lines, a.out, "ray_collective", {"points": points, "timer_late_s": late})


if __name__ == "__main__":
    main()
