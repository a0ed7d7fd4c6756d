"""``aioccl-perf``: the nccl-tests of aioccl.

    aioccl-perf all_reduce -b 8 -e 64M -f 2 -n 20 -w 5 -c 1 -d float32 -o sum --np 4 [--json F] [--plot F.png]

Without a launcher environment it starts ``--np`` ranks through
``aioccl-run`` and shows a progress bar (on a terminal); under a launcher it
runs as one of the ranks. Columns and bus-bandwidth formulas are nccl-tests':
time is the loop time over ``-n`` back-to-back ops divided by ``-n``, combined
across ranks by ``-a`` (0 rank 0, 1 average, 2 min, 3 max; default 1). The
JSON also has, per size, the median of per-iteration times of the slowest rank.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any

import numpy as np

from .. import __version__, lowlevel
from ..dtypes import SUPPORTED_DTYPES
from .perf_cases import OPS, ROOTED, busbw_factor, make

NCCL_TYPE_NAMES = {"float": "float32", "half": "float16", "double": "float64", "int": "int32",
                   "char": "int8", "bf16": "bfloat16"}
DTYPES = {np.dtype(d).name: np.dtype(d) for d in SUPPORTED_DTYPES}
LAUNCHER_VARS = ("AIOCCL_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("B")
    try:
        return int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 8, 64K, 16M)") from None


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="aioccl-perf", description=__doc__.split("\n\n")[0])
    p.add_argument("op", choices=OPS, help="pingpong: pairs (0,1), (2,3)... send back and forth; times are one-way")
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("8"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("64M"))
    p.add_argument("-f", "--stepfactor", type=float, default=2.0)
    p.add_argument("-i", "--stepbytes", type=parse_size, default=0, help="fixed increment (instead of -f)")
    p.add_argument("--sizes", default=None, help="explicit comma-separated sizes (instead of -b/-e/-f)")
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup_iters", type=int, default=5)
    p.add_argument("-c", "--check", type=int, default=1, help="check results (1) or not (0)")
    p.add_argument("-d", "--datatype", default="float32")
    p.add_argument("-o", "--op", dest="redop", default="sum", choices=("sum", "prod", "min", "max", "avg"))
    p.add_argument("-r", "--root", type=int, default=0)
    p.add_argument("-a", "--average", type=int, default=1, choices=(0, 1, 2, 3))
    p.add_argument("--np", type=int, default=2, help="ranks to start when not under a launcher")
    p.add_argument("--engine", choices=("inline", "thread"), default="inline")
    p.add_argument("--bind-to", choices=("core", "none"), default=None,
                   help="ranks started here: each on a core of its own, as mpirun binds nccl-tests' ranks (default "
                        "with the inline engine), or unbound (default with the thread engine: two threads a rank)")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="gpu: cupy buffers on the current GPU (times include the results reaching the GPU)")
    p.add_argument("--registered", action="store_true",
                   help="buffers from comm.alloc: zero-copy between ranks on one host (like NCCL's registration)")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--plot", metavar="FILE.png")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")
    ns = p.parse_args(argv)
    name = NCCL_TYPE_NAMES.get(ns.datatype, ns.datatype)
    if name not in DTYPES:
        p.error(f"unknown datatype {ns.datatype!r}; one of {', '.join(DTYPES)}")
    ns.dtype = DTYPES[name]
    if ns.redop == "avg" and ns.dtype.kind in "iu":
        p.error("-o avg needs a floating datatype")
    if ns.minbytes < 1 or ns.maxbytes < ns.minbytes or (ns.stepbytes <= 0 and ns.stepfactor <= 1):
        p.error("need 1 <= -b <= -e, and -f > 1 or -i > 0")
    if ns.iters < 1 or ns.warmup_iters < 0 or ns.np < 1:
        p.error("need -n >= 1, -w >= 0, --np >= 1")
    return ns


def sizes(ns: argparse.Namespace) -> list[int]:
    if ns.sizes:
        return [parse_size(x) for x in ns.sizes.split(",") if x.strip()]
    out, s = [], ns.minbytes
    while s <= ns.maxbytes:
        out.append(s)
        s = s + ns.stepbytes if ns.stepbytes > 0 else max(s + 1, int(s * ns.stepfactor))
    return out


async def _measure(comm: Any, case: Any, ns: argparse.Namespace) -> tuple[float, float, int]:
    """(combined loop time per op, median per-iteration time of the slowest rank, #wrong) in seconds."""
    wrong = await case.check() if ns.check else 0
    for _ in range(ns.warmup_iters):
        await case.run()
    await comm.barrier()
    per_iter = []
    t_loop = time.perf_counter()
    sync = _gpu_sync() if ns.device == "gpu" else (lambda: None)
    for _ in range(ns.iters):
        t0 = time.perf_counter()
        await case.run()
        sync()
        per_iter.append(time.perf_counter() - t0)
    loop = (time.perf_counter() - t_loop) / ns.iters / case.legs
    per_iter = [t / case.legs for t in per_iter]
    sums = np.array([loop, wrong], np.float64)  # -> average time, total #wrong
    mins = np.array([loop])
    maxs = np.array([loop, float(np.median(per_iter))])  # -> slowest loop, slowest rank's median
    first = np.array([loop])
    await comm.all_reduce(sums)
    await comm.all_reduce(mins, op="min")
    await comm.all_reduce(maxs, op="max")
    await comm.broadcast(first, root=0)
    combined = {0: first[0], 1: sums[0] / comm.world_size, 2: mins[0], 3: maxs[0]}[ns.average]
    return combined, maxs[1], int(sums[1])


def _gpu_sync() -> Any:
    """Wait for the current stream: an op's Work completes when its results are *enqueued*."""
    from ..gpu.probe import load_cupy

    cp = load_cupy("aioccl-perf --device gpu")
    return lambda: cp.cuda.get_current_stream().synchronize()


def _cols(t: float | None, nbytes: int, factor: float, wrong: int | None) -> tuple[str, dict[str, Any]]:
    if t is None:
        return f"{'N/A':>9} {'N/A':>7} {'N/A':>7} {'N/A':>6}", {}
    alg = nbytes / t / 1e9
    return (f"{t * 1e6:>9.2f} {alg:>7.2f} {alg * factor:>7.2f} {wrong if wrong is not None else 'N/A':>6}",
            {"time_us": t * 1e6, "algbw": alg, "busbw": alg * factor, "wrong": wrong})


async def run_rank(ns: argparse.Namespace) -> int:
    import aioccl

    comm = await aioccl.init(engine=ns.engine)
    n, r = comm.world_size, comm.rank
    def say(line: str) -> None:
        if r == 0:
            print(line, flush=True)

    root = ns.root if ns.op in ROOTED else -1
    if ns.device == "gpu" and ns.dtype.name == "bfloat16":
        say("# --device gpu: cupy has no bfloat16 arrays to allocate; bfloat16 GPU buffers come from JAX or torch")
        return 2
    if ns.op in ROOTED and not 0 <= ns.root < n:
        say(f"# -r {ns.root} is not a rank of {n}")
        return 2
    say(f"# aioccl-perf {__version__}: {ns.op}, {n} ranks ({comm.local_world_size} on this host), "
        f"engine {comm.engine_placement}, transport {comm.transport}{', registered buffers' if ns.registered else ''}, "
        f"{'GPU buffers, ' if ns.device == 'gpu' else ''}"
        f"iters {ns.iters}, warmup {ns.warmup_iters}, check {ns.check}")
    say(f"# {'':52}{'out-of-place':^33}{'in-place':^33}")
    timing = f" {'time':>9} {'algbw':>7} {'busbw':>7} {'#wrong':>6}"
    units = f" {'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}"
    say(f"# {'size':>10} {'count':>12} {'type':>9} {'redop':>6} {'root':>5}{timing}{timing}")
    say(f"# {'(B)':>10} {'(elements)':>12} {'':>9} {'':>6} {'':>5}{units}{units}")
    factor = busbw_factor(ns.op, n)
    rows, total_wrong, busbws = [], 0, []
    for size in sizes(ns):
        row: dict[str, Any] = {"size": size}
        texts = []
        count = 0
        for in_place in (False, True):
            case = None  # the previous case's buffers go back first (registered memory is finite)
            case = make(comm, ns.op, size, ns.dtype, ns.redop, ns.root, in_place, ns.registered, ns.device)
            if case is None:
                texts.append(_cols(None, 0, factor, None)[0])
                continue
            count = case.count
            t, median, wrong = await _measure(comm, case, ns)
            nbytes = case.count * ns.dtype.itemsize
            text, data = _cols(t, nbytes, factor, wrong if ns.check else None)
            data["median_us"] = median * 1e6
            texts.append(text)
            row["in_place" if in_place else "out_of_place"] = data
            total_wrong += wrong
            busbws.append(data["busbw"])
        if count == 0:
            continue  # empty for this op and rank count (nccl-tests skips these sizes too)
        row.update(count=count, bytes=count * ns.dtype.itemsize)
        rows.append(row)
        say(f"  {count * ns.dtype.itemsize:>10} {count:>12} {ns.dtype.name:>9} "
            f"{ns.redop if ns.op in ('all_reduce', 'reduce', 'reduce_scatter') else 'none':>6} {root:>5} "
            f"{texts[0]} {texts[1]}")
    say(f"# Out of bounds values : {total_wrong} {'OK' if total_wrong == 0 else 'FAILED'}")
    say(f"# Avg bus bandwidth    : {np.mean(busbws) if busbws else 0:.4f}")
    if r == 0:
        report = {"tool": "aioccl-perf", "version": __version__, "op": ns.op, "dtype": ns.dtype.name,
                  "redop": ns.redop, "root": root, "nranks": n, "local_nranks": comm.local_world_size,
                  "engine": comm.engine_placement, "transport": comm.transport, "registered": ns.registered,
                  "device": ns.device, "gpu_path": lowlevel.gpu_path(comm),
                  "iters": ns.iters, "warmup": ns.warmup_iters,
                  "average": ns.average, "busbw_factor": factor, "python": platform.python_version(),
                  "numpy": np.__version__, "host": platform.node(),
                  "env": {k: v for k, v in os.environ.items() if k.startswith("AIOCCL_") and "SECRET" not in k},
                  "rows": rows, "wrong": total_wrong}
        if ns.json:
            with open(ns.json, "w") as f:
                json.dump(report, f, indent=1)
        if ns.plot:
            from .perf_plot import plot

            plot(report, ns.plot)
    await comm.close()
    return 1 if total_wrong else 0


def spawn(ns: argparse.Namespace, argv: list[str]) -> int:
    """Start --np ranks through the launcher, relay rank 0's table, draw a progress bar."""
    bind = ns.bind_to or ("core" if ns.engine == "inline" else "none")
    cmd = [sys.executable, "-m", "aioccl.run", "--nproc-per-node", str(ns.np), "--no-prefix", "--bind-to", bind,
           "-m", "aioccl.tools.perf", *argv]
    show = sys.stderr.isatty() if ns.progress is None else ns.progress
    total, done = len(sizes(ns)), 0
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1)
    assert proc.stdout is not None
    for line in proc.stdout:
        if show:
            sys.stderr.write("\r\033[K")
        sys.stdout.write(line)
        sys.stdout.flush()
        if line.strip() and not line.startswith("#"):
            done += 1
        if show and done < total:
            bar = int(30 * done / total)
            sys.stderr.write(f"[{'#' * bar}{'.' * (30 - bar)}] {done}/{total} sizes")
            sys.stderr.flush()
    if show:
        sys.stderr.write("\r\033[K")
    return proc.wait()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ns = parse_args(argv)
    if any(v in os.environ for v in LAUNCHER_VARS):
        sys.exit(asyncio.run(run_rank(ns)))
    sys.exit(spawn(ns, argv))


if __name__ == "__main__":
    main()
