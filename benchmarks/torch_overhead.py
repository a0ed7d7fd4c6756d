"""What a torch user pays: all_reduce of torch CPU tensors through aioccl, against the same through numpy
arrays, and against torch.distributed's own Gloo backend, in one session.

    python benchmarks/torch_overhead.py [--procs 2] [--iters 2000] [--repeats 3] [--out docs/bench]

Each configuration runs in fresh processes under ``aioccl-run`` (Gloo is
initialised from the same rank numbers over TCP on loopback), back to back in
rotating order per repeat (``_modes.py``). A run's time is the median
per-call time of the slowest rank after a warm-up; the table gives the
median over repeats. Results are checked once per size (exact small integers).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import _modes  # noqa: E402

from aioccl.bootstrap.ports import reserve  # noqa: E402

MODES = ("aioccl-numpy", "aioccl-torch", "gloo")
NAMES = {"aioccl-numpy": "aioccl, numpy array", "aioccl-torch": "aioccl, torch tensor",
         "gloo": "torch.distributed (Gloo)"}
SIZES = (8, 1 << 16, 1 << 20)


def rank_main(mode: str, iters: int, port: int) -> None:
    import numpy as np
    import torch

    torch.set_num_threads(1)
    rank, n = int(os.environ["AIOCCL_RANK"]), int(os.environ["AIOCCL_WORLD_SIZE"])
    want = n * (n + 1) / 2
    if mode == "gloo":
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
        _modes.torch_rows(SIZES, rank, want, iters)
        return

    import asyncio

    import aioccl

    async def main() -> None:
        async with await aioccl.init() as comm:
            med = []
            for size in SIZES:
                t = torch.full((size // 4,), float(rank + 1))
                x = t if mode == "aioccl-torch" else t.numpy()
                await comm.all_reduce(x)
                assert bool((t == want).all())
                med.append(await _modes.time_async(lambda x=x: comm.all_reduce(x), iters))
            worst = np.array(med)
            await comm.all_reduce(worst, op="max")
            if rank == 0:
                print(_modes.result_line(SIZES, worst))

    asyncio.run(main())


def main() -> None:
    ap = _modes.parser(__doc__, MODES)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.rank_mode:
        rank_main(ns.rank_mode, ns.iters, ns.port)
        return
    def one(mode: str) -> dict[str, float]:
        with reserve("127.0.0.1") as port:  # held while the ranks use it
            return _modes.launch(__file__, mode, ns.procs, ["--iters", str(ns.iters), "--port", str(port.port)])

    runs = _modes.rotate(MODES, ns.repeats, one)
    table = _modes.medians(runs, SIZES)
    import torch

    lines = [f"{ns.procs} ranks on one host, float32 all_reduce in place, torch {torch.__version__}, median of "
             f"{ns.repeats} runs (each the median per call of the slowest rank, {ns.iters} calls):", "",
             "| | 8 B | 64 KiB | 1 MiB |", "|---|---:|---:|---:|"]
    for m in MODES:
        lines.append(f"| {NAMES[m]} | " + " | ".join(f"{table[m][str(s)]:.1f} us" for s in SIZES) + " |")
    _modes.save(ns.out, "torch_overhead", "\n".join(lines),
                {"procs": ns.procs, "iters": ns.iters, "runs": runs, "median_us": table})


if __name__ == "__main__":
    main()
