"""The native core against the Python path, through the public API: 8 B to 1 MiB all_reduce, awaited in
asyncio and through the sync API, on 1 and N ranks, and torch's ``dist.all_reduce`` through
``backend="aioccl"``, each with the core on and with ``AIOCCL_NATIVE=0``, in one session.

    python benchmarks/native_core.py [--procs 2] [--iters 5000] [--repeats 3] [--out docs/bench]

Each mode runs in fresh processes under ``aioccl-run`` (``_modes.py``): modes back to back in rotating
order per repeat; a run's time is the median per-call time of the slowest rank after a warm-up; the table
gives the median over repeats. Results are checked once per size (exact small integers). The peers'
figures (Open MPI, Gloo) for the same ops come from ``compare.py`` in the same session.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import _modes  # noqa: E402

SIZES = (8, 1 << 16, 1 << 20)
WAYS = ("async", "sync", "one-rank async", "one-rank sync", "torch dist")
MODES = tuple(f"{w}|{core}" for w in WAYS for core in ("native", "python"))


def rank_main(mode: str, iters: int) -> None:
    import numpy as np

    import aioccl

    way = mode.split("|")[0]
    rank, n = int(os.environ["AIOCCL_RANK"]), int(os.environ["AIOCCL_WORLD_SIZE"])
    want = n * (n + 1) // 2
    if way == "torch dist":
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group(backend="aioccl")
        _modes.torch_rows(SIZES, rank, want, iters)
        return
    if way.endswith("sync"):
        comm = aioccl.init_sync()
        med = []
        for size in SIZES:
            x = np.full(size // 4, rank + 1, np.float32)
            comm.all_reduce(x).wait()
            assert (x == want).all()
            med.append(_modes.time_sync(lambda x=x: comm.all_reduce(x).wait(), iters))
        worst = np.array(med)
        comm.all_reduce(worst, op="max").wait()
        if rank == 0:
            print(_modes.result_line(SIZES, worst), flush=True)
        comm.close().wait()
        return

    import asyncio

    async def main() -> None:
        async with await aioccl.init() as comm:
            med = []
            for size in SIZES:
                x = np.full(size // 4, rank + 1, np.float32)
                await comm.all_reduce(x)
                assert (x == want).all()
                med.append(await _modes.time_async(lambda x=x: comm.all_reduce(x), iters))
            worst = np.array(med)
            await comm.all_reduce(worst, op="max")
            if rank == 0:
                print(_modes.result_line(SIZES, worst), flush=True)

    asyncio.run(main())


def main() -> None:
    ap = _modes.parser(__doc__, MODES)
    ns = ap.parse_args()
    if ns.rank_mode:
        rank_main(ns.rank_mode, ns.iters)
        return

    def one(mode: str) -> dict[str, float]:
        os.environ["AIOCCL_NATIVE"] = "1" if mode.endswith("native") else "0"
        procs = 1 if mode.startswith("one-rank") else ns.procs
        return _modes.launch(__file__, mode, procs, ["--iters", str(ns.iters)])

    runs = _modes.rotate(MODES, ns.repeats, one)
    table = _modes.medians(runs, SIZES)
    lines = [f"float32 all_reduce in place, {ns.procs} ranks on one host (one-rank: 1), median of {ns.repeats} runs "
             f"(each the median per call of the slowest rank, {ns.iters} calls):", "",
             "| way | core | 8 B | 64 KiB | 1 MiB |", "|---|---|---:|---:|---:|"]
    for m in MODES:
        way, core = m.split("|")
        lines.append(f"| {way} | {core} | " + " | ".join(f"{table[m][str(s)]:.2f} us" for s in SIZES) + " |")
    _modes.save(ns.out, f"native_core_{ns.procs}", "\n".join(lines),
                {"procs": ns.procs, "iters": ns.iters, "runs": runs, "median_us": table})


if __name__ == "__main__":
    main()
