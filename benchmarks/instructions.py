"""Instructions per call, counted by callgrind: the cost of the layers above the wire, repeatably.

Timing a 2 us call on a shared machine swings tenfold; an instruction count does not. Each case runs
``rounds`` calls in one process, and the count per call is the difference between the totals of two runs
(``--rounds`` and twice that) divided by ``rounds``, so start-up and set-up cancel out. ``--tree`` runs
another checkout's aioccl (its native core built in place, as ``scripts``' A/B runs do) with this
interpreter. Cases (one process, the method docs/benchmarks.md names):

- ``all_reduce``: an 8-byte in-place ``comm.all_reduce`` on a communicator of one rank;
- ``all_reduce_out``: the same with ``out=``;
- ``isend_irecv``: an 8-byte ``isend`` and its ``irecv`` between two communicators of one process
  (shared memory, inline engine);
- ``dist_all_reduce``: ``torch.distributed.all_reduce`` of an 8-byte CPU tensor, backend "aioccl", one rank.

    python benchmarks/instructions.py --case all_reduce [--tree /path/to/other/checkout]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

CASES = ("all_reduce", "all_reduce_out", "isend_irecv", "dist_all_reduce")


def _use_tree(tree: str) -> None:
    """Import aioccl from ``tree``, not from the editable install (whose finder is asked before sys.path)."""
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()]
    sys.path.insert(0, tree)


def run_case(case: str, rounds: int) -> None:
    import asyncio

    import numpy as np

    import aioccl

    if case == "dist_all_reduce":
        import torch
        import torch.distributed as dist

        from aioccl.bootstrap.ports import reserve

        port = reserve("127.0.0.1")
        dist.init_process_group("aioccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        t = torch.ones(2, dtype=torch.float32)
        for _ in range(rounds):
            dist.all_reduce(t)
        dist.destroy_process_group()
        return

    async def main() -> None:
        n = 2 if case == "isend_irecv" else 1
        uid = aioccl.UniqueId.new(host="127.0.0.1")
        comms = await asyncio.gather(*(aioccl.Communicator.create(uid, r, n) for r in range(n)))
        x, out = np.ones(2, np.float32), np.zeros(2, np.float32)
        if case == "all_reduce":
            for _ in range(rounds):
                await comms[0].all_reduce(x)
        elif case == "all_reduce_out":
            for _ in range(rounds):
                await comms[0].all_reduce(x, out=out)
        else:
            a, b = comms
            for _ in range(rounds):
                r = b.irecv(out, 0)
                await a.isend(x, 1)
                await r
        await asyncio.gather(*(c.close() for c in comms))

    asyncio.run(main())


def count(case: str, rounds: int, tree: str | None) -> int:
    """callgrind's total instructions for one run of ``rounds`` calls."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "cg.out")
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, __file__,
               "--case", case, "--rounds", str(rounds), "--child"] + (["--tree", tree] if tree else [])
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        m = re.search(r"Collected : (\d+)", p.stderr)
        if p.returncode != 0 or m is None:
            raise SystemExit(f"{case}: callgrind failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
        return int(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=CASES, required=True)
    ap.add_argument("--rounds", type=int, default=20000)
    ap.add_argument("--tree", default=None, help="another checkout whose aioccl to run")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.tree:
        _use_tree(args.tree)
    if args.child:
        run_case(args.case, args.rounds)
        return
    one, two = count(args.case, args.rounds, args.tree), count(args.case, 2 * args.rounds, args.tree)
    print(f"{args.case} {args.tree or 'this tree'}: {(two - one) / args.rounds:.0f} instructions per call")


if __name__ == "__main__":
    main()
