"""How long a ray.util.collective group takes to form: aioccl's "AIOCCL" backend against Ray's GLOO, one run.

    python benchmarks/ray_setup.py [--actors 2,4] [--repeats 5] [--out docs/bench/ray]

One local Ray cluster and, per actor count, one set of actors (started once: an actor's start is Ray's, the
same for both). Per repeat and actor count, each backend in turn (rotating order), under a fresh group name:

- ``init``: every actor calls ``col.init_collective_group`` at once; the figure is the slowest actor's time
  inside that call (measured in the actor), and inside it and its first 1-element ``allreduce`` (a backend may
  connect on first use); the driver's wall time from the first ``.remote`` to the last reply beside it;
- ``create``: the driver declares the group (``col.create_collective_group``), then every actor makes its
  first call, a 1-element ``allreduce``, which forms the group there (Ray's declarative groups form on first
  use); the figure is the slowest actor's time in that first call, checked exact.

Each group is destroyed before the next. The table gives medians over the repeats and GLOO's time over
aioccl's. Writes ``ray_setup.json`` and ``ray_setup.md``.
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
    try:
        for n in counts:
            members = [Member.remote() for _ in range(n)]
            ray.get([m.__ray_ready__.remote() for m in members])
            for rep in range(a.repeats):
                for backend in BACKENDS if rep % 2 == 0 else BACKENDS[::-1]:
                    name = f"init-{backend}-{n}-{rep}"
                    t = time.perf_counter()
                    times = ray.get([m.init.remote(n, r, backend, name) for r, m in enumerate(members)])
                    wall = time.perf_counter() - t
                    ray.get([m.destroy.remote(name) for m in members])
                    points.append({"backend": backend, "actors": n, "how": "init", "repeat": rep,
                                   "s": max(i for i, _ in times), "driver_s": wall})
                    points.append({"backend": backend, "actors": n, "how": "init + first call", "repeat": rep,
                                   "s": max(i + f for i, f in times), "driver_s": wall})
                    name = f"create-{backend}-{n}-{rep}"
                    t = time.perf_counter()
                    col.create_collective_group(members, n, list(range(n)), backend=backend, group_name=name)
                    first = max(ray.get([m.first_call.remote(n, name) for m in members]))
                    wall = time.perf_counter() - t
                    ray.get([m.destroy.remote(name) for m in members])
                    points.append({"backend": backend, "actors": n, "how": "create", "repeat": rep, "s": first,
                                   "driver_s": wall})
                    print(f"{n} actors, repeat {rep}, {backend}: init {points[-3]['s'] * 1e3:.1f} ms, "
                          f"create + first call {first * 1e3:.1f} ms", flush=True)
            for m in members:
                ray.kill(m)
    finally:
        ray.shutdown()
        shutil.rmtree(folder, ignore_errors=True)

    def med(backend: str, n: int, how: str, key: str) -> float:
        return statistics.median(pt[key] for pt in points
                                 if (pt["backend"], pt["actors"], pt["how"]) == (backend, n, how))

    lines = ["# Forming a ray.util.collective group: aioccl (AIOCCL) vs Ray's GLOO backend", "",
             f"Medians of {a.repeats} repeats, the same actors in one run, backends in rotating order; "
             f"`python benchmarks/ray_setup.py --actors {a.actors} --repeats {a.repeats}`. *init*: the slowest "
             "actor's time inside `col.init_collective_group`, and with its first 1-element `allreduce` (GLOO's "
             "first op finishes connecting); the driver's wall time in brackets; *create*: "
             "`col.create_collective_group` on the driver, then the slowest actor's first `allreduce` (which "
             "forms the group).", "",
             "| actors | how | aioccl ms | GLOO ms | GLOO / aioccl |", "|---|---|---|---|---|"]
    for n in counts:
        for how in ("init", "init + first call", "create"):
            ours, gloo = med("AIOCCL", n, how, "s"), med("GLOO", n, how, "s")
            wall = f" ({med('AIOCCL', n, how, 'driver_s') * 1e3:.0f} / {med('GLOO', n, how, 'driver_s') * 1e3:.0f})"
            lines.append(f"| {n} | {how} | {ours * 1e3:.1f} | {gloo * 1e3:.1f} | {gloo / ours:.2f}x{wall} |")
    report(lines, a.out, "ray_setup", {"points": points})


if __name__ == "__main__":
    main()
