"""Per-call cost of jax_ext collectives against jax.lax's own CPU collectives (Gloo), one session.

    python benchmarks/jax_overhead.py [--procs 2] [--sizes 8,16M] [--iters 200] [--repeats 3] [--out docs/bench]

Launches ``--procs`` processes joined by ``jax.distributed`` (one CPU device
each, ``jax_cpu_collectives_implementation=gloo``) and, in each, times jitted
functions over a mesh of all devices: ``lax.psum`` (XLA's all-reduce on
Gloo), ``jax_ext.psum`` (the same in shard_map, run by aioccl) and
``jax_ext.all_reduce`` (process-level, plain jit); and 8 independent psums in
one function, which shows what an extra collective costs once the call is
paid. Reports the median over repeats of each run's median time per call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def worker(sizes: list[int], iters: int) -> dict:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(os.environ["JB_COORD"], int(os.environ["JB_NPROC"]), int(os.environ["JB_PID"]))
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jax_ext

    mesh = jax.make_mesh((jax.device_count(),), ("i",))
    results: dict = {}
    for size in sizes:
        count = max(1, size // 4)
        local = np.ones(count, np.float32)
        glob = jax.make_array_from_process_local_data(NamedSharding(mesh, P("i")), local)

        def in_mesh(body, k=1):
            def several(v):
                outs = [body(v + j) for j in range(k)]
                return sum(outs[1:], outs[0])
            return jax.jit(jax.shard_map(several, mesh=mesh, in_specs=P("i"), out_specs=P("i")))

        cases = {
            "lax.psum": (in_mesh(lambda v: jax.lax.pcast(jax.lax.psum(v, "i"), "i", to="varying")), glob),
            "jax_ext.psum": (in_mesh(lambda v: jax.lax.pcast(jax_ext.psum(v, "i"), "i", to="varying")), glob),
            "jax_ext.all_reduce": (jax.jit(jax_ext.all_reduce), jnp.asarray(local)),
            "lax.psum x8": (in_mesh(lambda v: jax.lax.pcast(jax.lax.psum(v, "i"), "i", to="varying"), 8), glob),
            "jax_ext.psum x8": (in_mesh(lambda v: jax.lax.pcast(jax_ext.psum(v, "i"), "i", to="varying"), 8), glob),
        }
        for name, (f, arg) in cases.items():
            n = iters if size <= 1 << 16 else max(10, iters // 10)
            for _ in range(5):
                f(arg).block_until_ready()
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                f(arg).block_until_ready()
                times.append(time.perf_counter() - t0)
            results.setdefault(name, {})[size] = statistics.median(times)
    jax_ext.shutdown()
    return results


def run_once(procs: int, sizes: list[int], iters: int) -> dict:
    from aioccl.bootstrap.ports import reserve

    reservation = reserve("127.0.0.1")  # held until the workers are done with it
    port = reservation.port
    ps = []
    for pid in range(procs):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "JB_COORD": f"127.0.0.1:{port}", "JB_NPROC": str(procs),
               "JB_PID": str(pid), "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
        ps.append(subprocess.Popen([sys.executable, __file__, "--worker", "--sizes", ",".join(map(str, sizes)),
                                    "--iters", str(iters)], env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, text=True))
    outs = [p.communicate(timeout=900)[0] for p in ps]
    reservation.close()
    if any(p.returncode for p in ps):
        raise SystemExit(f"a worker failed: {outs}")
    per_rank = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    return {name: {size: max(r[name][size] for r in per_rank) for size in per_rank[0][name]}
            for name in per_rank[0]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--sizes", default="8,16M")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", action="store_true")
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if args.worker:
        print(json.dumps(worker(sizes, args.iters)))
        return
    runs = [run_once(args.procs, sizes, args.iters) for _ in range(args.repeats)]
    table = {name: {str(size): statistics.median(r[name][str(size)] for r in runs) for size in sizes}
             for name in runs[0]}
    import jax

    lines = [f"jax {jax.__version__}, Python {sys.version.split()[0]}: {args.procs} processes x 1 CPU device, median "
             f"of {args.repeats} runs (each the median per call of the slowest process), time per jitted call:", "",
             "| | " + " | ".join(f"{s} B" for s in sizes) + " |", "|---|" + "---:|" * len(sizes)]
    for name, row in table.items():
        lines.append(f"| {name} | " + " | ".join(f"{row[str(s)] * 1e6:.0f} us" for s in sizes) + " |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "jax_overhead.json").write_text(json.dumps({"jax": jax.__version__, "procs": args.procs, "runs": runs,
                                                           "median": table},
                                                          indent=1))
        (out / "jax_overhead.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
