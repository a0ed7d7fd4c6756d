"""aioccl (shared memory, registered buffers, sockets only), Gloo and Open MPI side by side, one session.

    make bench            # sets up .venv-bench (torch CPU, mpi4py, Open MPI) and runs this
    python benchmarks/compare.py --ranks 2,4 --ops all_reduce,all_gather,reduce_scatter,broadcast \\
        --sizes 8,1K,64K,1M,16M,64M --repeats 3 --out docs/bench

For each repeat, rank count and op, the libraries run back to back
(in rotating order) in fresh processes. The reported time is the median
over repeats of each run's median per-iteration time of the slowest rank;
all_reduce and broadcast are in place, all_gather and reduce_scatter out of
place (each library's native form). Writes compare.json, compare.md (tables
with ratios) and one busbw plot per op.

Busy machine: ``--loads none,hog1,hog2,mixed`` runs everything again beside
each background load of ``_load.py`` (one or two CPU-bound processes; a
seeded mix of process starts, sleeps, fsyncs and compute, like a test suite
beside you), started afresh for every library's run, and adds a table of
each library's time under load over its own idle time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _load import LOADS, load  # noqa: E402
from _sweep import iterations  # noqa: E402  (the peers' iteration counts, shared with their runners)

ROOT = HERE.parent
# aioccl: its default (shared memory on one host), with registered buffers (comm.alloc), sockets only, and
# (by name only) with a pure spin instead of a yielding one (AIOCCL_SHM_YIELD=0, the wait before issue 36)
LIBS = ("aioccl", "aioccl-reg", "aioccl-tcp", "gloo", "mpi")
OPTIONAL = ("aioccl-spin", "aioccl-python")  # aioccl-python: AIOCCL_NATIVE=0, the Python path (A/B of the core)
PEERS = ("gloo", "mpi")


def run_aioccl(lib: str, op: str, n: int, sizes: list[int], extra_env: dict[str, str] | None = None) -> list[dict]:
    """aioccl-perf once per size, with the iteration and warm-up counts the peers' loop uses for that
    size (``_sweep.iterations``), so every library is timed the same way."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOCCL_") or k == "AIOCCL_ALGO"}
    env.update(extra_env or {})
    extra = ["--registered"] if lib == "aioccl-reg" else []
    if lib == "aioccl-tcp":
        env["AIOCCL_SHM_DISABLE"] = "1"
    if lib == "aioccl-spin":
        env["AIOCCL_SHM_YIELD"] = "0"
    if lib == "aioccl-python":
        env["AIOCCL_NATIVE"] = "0"
    key = "in_place" if op in ("all_reduce", "broadcast") else "out_of_place"
    points = []
    for size in sizes:
        iters, warm = iterations(size)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "r.json"
            subprocess.run([sys.executable, "-m", "aioccl.tools.perf", op, "--sizes", str(size), "-n", str(iters),
                            "-w", str(warm), "--np", str(n), "--json", str(out), *extra], check=True, env=env,
                           stdout=subprocess.DEVNULL, timeout=1800)
            report = json.loads(out.read_text())
        points += [{"lib": lib, "op": op, "ranks": n, "bytes": row["bytes"], "median_us": row[key]["median_us"],
                    "mean_us": row[key]["time_us"], "wrong": row[key]["wrong"],
                    "busbw": row["bytes"] / (row[key]["median_us"] * 1e-6) / 1e9 * report["busbw_factor"]}
                   for row in report["rows"]]
    return points


def run_peer(lib: str, op: str, n: int, sizes: list[int]) -> list[dict]:
    args = ["--op", op, "--sizes", ",".join(map(str, sizes))]
    if lib == "gloo":
        cmd = [sys.executable, str(HERE / "peer_gloo.py"), "--np", str(n), *args]
    else:
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n), sys.executable,
               str(HERE / "peer_mpi.py"), *args]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=1800).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def versions() -> dict[str, str]:
    v = {"python": platform.python_version(), "host": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                             time.gmtime())}
    for mod in ("numpy", "torch", "mpi4py"):
        try:
            v[mod] = __import__(mod).__version__
        except ImportError:
            v[mod] = "missing"
    try:
        import mpi4py

        # the version is readable before MPI_Init; initialising here would make this process an MPI singleton,
        # which needs Open MPI's daemons at their configured path (a wheel's mpirun has them elsewhere)
        mpi4py.rc.initialize = False
        from mpi4py import MPI

        v["mpi_library"] = MPI.Get_library_version().replace("\0", "").strip().splitlines()[0]  # C string: NUL-ended
    except ImportError:
        pass
    v["aioccl_commit"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                        capture_output=True, text=True).stdout.strip()
    v["cpu"] = cpu_model()
    return v


def cpu_model() -> str:
    """The processor, with its caches: ratios to a peer move between machines (an AMD Zen 3 guest and an Intel
    one with a 260 MiB L3 put aioccl's copies and Open MPI's single copy in different places)."""
    try:
        with open("/proc/cpuinfo") as f:
            name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            return f"{name}, L3 {f.read().strip()}"
    except OSError:
        return platform.processor() or "unknown"


def table(results: list[dict], ops: list[str], ranks: list[int]) -> str:
    """Per op and rank count: time and busbw of every library, and each peer's time over aioccl's."""
    lines = []
    for op in ops:
        for n in ranks:
            by: dict[int, dict[str, dict]] = {}
            for r in results:
                if r["op"] == op and r["ranks"] == n:
                    by.setdefault(r["bytes"], {})[r["lib"]] = r
            libs = [lib for lib in LIBS + OPTIONAL if any(lib in row for row in by.values())]
            peers = [p for p in PEERS if p in libs]
            head = (["size"] + [f"{lib} us" for lib in libs] + [f"{lib} busbw" for lib in libs]
                    + [f"{p}/aioccl" for p in peers])
            lines += [f"\n### {op}, {n} ranks\n", "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
            for size in sorted(by):
                row = by[size]
                cells = [str(size)]
                cells += [f"{row[lib]['median_us']:.1f}" if lib in row else "-" for lib in libs]
                cells += [f"{row[lib]['busbw']:.3f}" if lib in row else "-" for lib in libs]
                cells += [f"{row[p]['median_us'] / row['aioccl']['median_us']:.2f}x" if p in row and "aioccl" in row
                          else "-" for p in peers]
                lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def busy_table(results: list[dict], loads: list[str]) -> str:
    """Per library, op, ranks and size: the median under each load, and its ratio to the same library idle."""
    keys = sorted({(r["op"], r["ranks"], r["bytes"], r["lib"]) for r in results})
    at = {(r["op"], r["ranks"], r["bytes"], r["lib"], r["load"]): r["median_us"] for r in results}
    head = ["op", "ranks", "size", "lib"] + [f"{ld} us" for ld in loads] + [f"{ld}/idle" for ld in loads[1:]]
    lines = ["\n### busy machine: each library under load, against itself idle\n", "| " + " | ".join(head) + " |",
             "|---" * len(head) + "|"]
    for op, n, size, lib in keys:
        times = [at.get((op, n, size, lib, ld)) for ld in loads]
        idle = times[0]
        cells = [op, str(n), str(size), lib] + [f"{t:.1f}" if t else "-" for t in times]
        cells += [f"{t / idle:.1f}x" if t and idle else "-" for t in times[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: list[dict], ops: list[str], ranks: list[int], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for op in ops:
        fig, axes = plt.subplots(1, len(ranks), figsize=(5 * len(ranks), 3.8), squeeze=False, sharey=True)
        for ax, n in zip(axes[0], ranks, strict=True):
            for lib in LIBS + OPTIONAL:
                pts = sorted((r["bytes"], r["busbw"]) for r in results if (r["op"], r["ranks"], r["lib"]) ==
                             (op, n, lib))
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker="o", label=lib)
            ax.set(xscale="log", yscale="log", title=f"{op}, {n} ranks", xlabel="size (bytes)")
            ax.grid(True, which="both", alpha=0.3)
        axes[0][0].set_ylabel("busbw (GB/s), median of repeats")
        axes[0][-1].legend()
        fig.tight_layout()
        fig.savefig(out / f"compare_{op}.png", dpi=100)
        plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--ops", default="all_reduce,all_gather,reduce_scatter,broadcast")
    p.add_argument("--sizes", default="8,1K,64K,1M,16M,64M")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--libs", default=",".join(LIBS))
    p.add_argument("--out", default="docs/bench")
    p.add_argument("--loads", default="none", help=f"background loads to run under, in turn: {','.join(LOADS)}")
    a = p.parse_args()
    from aioccl.tools.perf import parse_size

    ranks = [int(x) for x in a.ranks.split(",")]
    ops = a.ops.split(",")
    sizes = [parse_size(x) for x in a.sizes.split(",")]
    libs = a.libs.split(",")
    loads = a.loads.split(",")
    if any(ld not in LOADS for ld in loads):
        p.error(f"--loads: each one of {', '.join(LOADS)}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    raw: list[dict] = []
    for rep in range(a.repeats):
        for kind in loads:
            for n in ranks:
                for i, op in enumerate(ops):
                    order = libs[(rep + i) % len(libs):] + libs[:(rep + i) % len(libs)]
                    for lib in order:
                        t0 = time.time()
                        with load(kind):
                            rows = (run_aioccl(lib, op, n, sizes) if lib.startswith("aioccl")
                                    else run_peer(lib, op, n, sizes))
                        for r in rows:
                            r["repeat"], r["load"] = rep, kind
                            if r["wrong"]:
                                print(f"WRONG RESULTS: {r}", file=sys.stderr)
                        raw += rows
                        print(f"repeat {rep + 1}/{a.repeats} load {kind:<5} {n} ranks {op:<15} {lib:<10} "
                              f"{time.time() - t0:5.1f}s", flush=True)
    merged = {}
    for r in raw:
        merged.setdefault((r["lib"], r["op"], r["ranks"], r["bytes"], r["load"]), []).append(r)
    results = []
    for (lib, op, n, size, kind), rs in sorted(merged.items()):
        med = statistics.median(x["median_us"] for x in rs)
        results.append({"lib": lib, "op": op, "ranks": n, "bytes": size, "load": kind, "median_us": med,
                        "runs_us": [x["median_us"] for x in rs], "wrong": sum(x["wrong"] for x in rs),
                        "busbw": statistics.median(x["busbw"] for x in rs)})
    meta = {"versions": versions(), "command": " ".join(sys.argv), "ranks": ranks, "ops": ops, "sizes": sizes,
            "repeats": a.repeats, "loads": loads}
    (out / "compare.json").write_text(json.dumps({"meta": meta, "results": results, "raw": raw}, indent=1))
    md = (f"Command: `{meta['command']}`\n\nVersions: "
          + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) + "\n")
    for kind in loads:
        md += (f"\n## load: {kind}\n" if len(loads) > 1 else "") + table(
            [r for r in results if r["load"] == kind], ops, ranks) + "\n"
    if len(loads) > 1:
        md += busy_table(results, loads) + "\n"
    (out / "compare.md").write_text(md)
    plot([r for r in results if r["load"] == loads[0]], ops, ranks, out)
    print(md)


if __name__ == "__main__":
    main()
