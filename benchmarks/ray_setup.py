"""How long a ray.util.collective group takes to form: aioccl's "AIOCCL" backend against Ray's GLOO, one run.

    python benchmarks/ray_setup.py [--actors 2,4] [--repeats 5] [--out docs/bench/ray]

One local Ray cluster. Per repeat, actor count and backend (rotating order), two sets of fresh actors (their
start is Ray's and the imports' alike for both backends: ``ray.util.collective`` imports torch for GLOO, and
the actor imports ``aioccl.ray``; none of it is timed):

- ``init``: every actor of the first set calls ``col.init_collective_group`` at once; the figure is the slowest
  actor's time inside that call and its first 1-element ``allreduce`` (a backend may connect on first use);
- ``create``: for the second set the driver declares the group (``col.create_collective_group``), then every
  actor makes its first call, a 1-element ``allreduce``, which forms the group there (Ray's declarative groups
  form on first use); the figure is the slowest actor's time in that first call, checked exact.

Each is the **first group** of its actors: what a Ray program's set-up costs. Then, on the same actors, the
group destroyed, a **later group** is formed the same way under a new name. Ray's GLOO backend makes torch's
default process group once per process and keeps it after ``destroy_collective_group``: its later groups are
``dist.new_group`` over that one (same world size only), no new rendezvous; aioccl's every group is a new
communicator met afresh. The table gives medians over the repeats and GLOO's time over aioccl's. Writes
``ray_setup.json`` and ``ray_setup.md``.
"""

from __future__ import annotations

import argparse
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

BACKENDS = ("AIOCCL", "GLOO")


@ray.remote
class Member:
    def __init__(self) -> None:
        import aioccl.ray  # noqa: F401  (registers the backend in this actor)

    def init(self, n: int, rank: int, backend: str, name: str) -> tuple[float, float]:
        """Seconds inside ``init_collective_group``, and then in the first call (a backend may connect lazily)."""
        t = time.perf_counter()
        col.init_collective_group(n, rank, backend=backend, group_name=name)
        return time.perf_counter() - t, self.first_call(n, name)

    def first_call(self, n: int, name: str) -> float:
        x = np.ones(1, np.float32)
        t = time.perf_counter()
        col.allreduce(x, name)
        took = time.perf_counter() - t
        if x[0] != n:
            raise AssertionError(f"allreduce of ones over {n} actors gave {x[0]}")
        return took

    def destroy(self, name: str) -> None:
        col.destroy_collective_group(name)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--actors", default="2,4")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="")
    a = p.parse_args()
    counts = [int(c) for c in a.actors.split(",")]
    folder = tempfile.mkdtemp(prefix="r")  # short: Ray's Unix sockets live under it
    ray.init(num_cpus=max(8, 2 * max(counts)), include_dashboard=False, object_store_memory=80 << 20,
             _temp_dir=folder, log_to_driver=False)
    import aioccl.ray  # noqa: F401  (the driver declares groups of the backend too)

    points = []

    def record(backend: str, n: int, how: str, rep: int, times: list[float]) -> None:
        points.append({"backend": backend, "actors": n, "how": how, "repeat": rep, "s": max(times)})

    try:
        for rep in range(a.repeats):
            for n in counts:
                for backend in BACKENDS if rep % 2 == 0 else BACKENDS[::-1]:
                    for way in ("init", "create"):
                        members = [Member.remote() for _ in range(n)]
                        ray.get([m.__ray_ready__.remote() for m in members])
                        for when in ("first group", "later group"):
                            name = f"{way}-{backend}-{n}-{rep}-{when.split()[0]}"
                            if way == "init":
                                times = ray.get([m.init.remote(n, r, backend, name) for r, m in enumerate(members)])
                                times = [i + f for i, f in times]
                            else:
                                col.create_collective_group(members, n, list(range(n)), backend=backend,
                                                            group_name=name)
                                times = ray.get([m.first_call.remote(n, name) for m in members])
                            ray.get([m.destroy.remote(name) for m in members])
                            record(backend, n, f"{way}, {when}", rep, times)
                            print(f"{n} actors, repeat {rep}, {backend}, {way}, {when}: {max(times) * 1e3:.1f} ms",
                                  flush=True)
                        for m in members:
                            ray.kill(m)
    finally:
        ray.shutdown()
        shutil.rmtree(folder, ignore_errors=True)

    def med(backend: str, n: int, how: str) -> float:
        return statistics.median(pt["s"] for pt in points
                                 if (pt["backend"], pt["actors"], pt["how"]) == (backend, n, how))

    lines = ["# Forming a ray.util.collective group: aioccl (AIOCCL) vs Ray's GLOO backend", "",
             f"Medians of {a.repeats} repeats, fresh actors per repeat and backend, backends in rotating order; "
             f"`python benchmarks/ray_setup.py --actors {a.actors} --repeats {a.repeats}`. The slowest actor's "
             "time: *init*: inside `col.init_collective_group` and its first 1-element `allreduce` (a backend may "
             "connect on first use); *create*: `col.create_collective_group` on the driver, then the first "
             "`allreduce` (which forms the group). *First group*: the actors' first (a program's set-up); "
             "*later group*: another on the same actors after `destroy_collective_group` (GLOO keeps torch's "
             "default process group and makes a subgroup of it; aioccl meets afresh).", "",
             "| actors | how | aioccl ms | GLOO ms | GLOO / aioccl |", "|---|---|---|---|---|"]
    for n in counts:
        for how in ("init, first group", "create, first group", "init, later group", "create, later group"):
            ours, gloo = med("AIOCCL", n, how), med("GLOO", n, how)
            lines.append(f"| {n} | {how} | {ours * 1e3:.1f} | {gloo * 1e3:.1f} | {gloo / ours:.2f}x |")
    report(lines, a.out, "ray_setup", {"points": points})


if __name__ == "__main__":
    main()
