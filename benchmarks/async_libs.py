"""What each way of awaiting costs: 8 B and 1 MiB all_reduce under asyncio (inline and proxy-thread
engines), trio (proxy thread) and blocking ``Work.wait()`` from a plain thread, in one session.

    python benchmarks/async_libs.py [--procs 2] [--iters 2000] [--repeats 3] [--out docs/bench]

Each configuration runs in fresh processes under ``aioccl-run``, configurations
back to back in rotating order per repeat (``_modes.py``). A run's time is the
median per-call time of the slowest rank (after a warm-up); the table gives
the median over repeats. Prints a markdown table and writes JSON.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import _modes  # noqa: E402

MODES = ("asyncio-inline", "asyncio-thread", "trio", "blocking")
SIZES = (8, 1 << 20)


def rank_main(mode: str, iters: int) -> None:
    """One rank: time ``iters`` all_reduce calls per size; rank 0 prints the slowest rank's medians."""
    import numpy as np

    import aioccl

    async def run_async(comm: aioccl.Communicator) -> None:
        med = []
        for size in SIZES:
            x = np.ones(size // 4, np.float32)
            med.append(await _modes.time_async(lambda x=x: comm.all_reduce(x), iters))
        worst = np.array(med)
        await comm.all_reduce(worst, op="max")
        if comm.rank == 0:
            print(_modes.result_line(SIZES, worst))

    async def main() -> None:
        engine = mode.split("-")[1] if mode.startswith("asyncio") else "auto"
        async with await aioccl.init(engine=engine) as comm:
            await run_async(comm)

    if mode.startswith("asyncio"):
        import asyncio

        asyncio.run(main())
    elif mode == "trio":
        import trio

        trio.run(main)
    else:
        comm = aioccl.init_sync()
        med = []
        for size in SIZES:
            x = np.ones(size // 4, np.float32)
            med.append(_modes.time_sync(lambda x=x: comm.all_reduce(x).wait(), iters))
        worst = np.array(med)
        comm.all_reduce(worst, op="max").wait()
        if comm.rank == 0:
            print(_modes.result_line(SIZES, worst))
        comm.close().wait()


def main() -> None:
    ap = _modes.parser(__doc__, MODES)
    ns = ap.parse_args()
    if ns.rank_mode:
        rank_main(ns.rank_mode, ns.iters)
        return
    runs = _modes.rotate(MODES, ns.repeats,
                         lambda mode: _modes.launch(__file__, mode, ns.procs, ["--iters", str(ns.iters)]))
    table = _modes.medians(runs, SIZES)
    lines = [f"{ns.procs} ranks on one host (shared memory), float32 all_reduce in place, median of {ns.repeats} "
             f"runs (each the median per call of the slowest rank, {ns.iters} calls):", "",
             "| how the caller waits | 8 B | 1 MiB |", "|---|---:|---:|"]
    for m in MODES:
        lines.append(f"| {m} | {table[m]['8']:.1f} us | {table[m][str(1 << 20)]:.1f} us |")
    _modes.save(ns.out, "async_libs", "\n".join(lines),
                {"procs": ns.procs, "iters": ns.iters, "runs": runs, "median_us": table})


if __name__ == "__main__":
    main()
