"""Instructions per call, counted by callgrind: the cost of the layers above the wire, repeatably.

Timing a 2 us call on a shared machine swings tenfold; an instruction count does not. Each case runs
``rounds`` calls in one process under ``valgrind --tool=callgrind --collect-atstart=no``, with collection
switched on just before the loop and off just after it (callgrind's client requests, from a helper built
here with ``cc`` against valgrind's header), so start-up and set-up never enter the count: the count per
call is the loop's total divided by ``rounds``. ``--tree`` runs
another checkout's aioccl (its native core built in place, as ``scripts``' A/B runs do) with this
interpreter. Cases (one process, the method docs/benchmarks.md names):

- ``all_reduce``: an 8-byte in-place ``comm.all_reduce`` on a communicator of one rank (done in the call);
- ``all_reduce_out``: the same with ``out=`` (on one rank the general way: through the engine, awaited);
- ``isend_irecv``: an 8-byte ``isend`` and then its ``irecv`` between two communicators of one process
  (shared memory, inline engine: both done in the call);
- ``dist_all_reduce``: ``torch.distributed.all_reduce`` of an 8-byte CPU tensor, backend "aioccl", one rank.

    python benchmarks/instructions.py --case all_reduce [--tree /path/to/other/checkout]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable

CASES = ("all_reduce", "all_reduce_out", "isend_irecv", "dist_all_reduce")


def _use_tree(tree: str) -> None:
    """Import aioccl from ``tree``, not from the editable install (whose finder is asked before sys.path)."""
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()]
    sys.path.insert(0, tree)


def _collection() -> tuple[Callable[[], None], Callable[[], None]]:
    """callgrind's switch, as two functions (``CALLGRIND_TOGGLE_COLLECT``), from a helper built once."""
    lib = os.environ["AIOCCL_CG_TOGGLE"]
    dll = ctypes.CDLL(lib)
    return dll.cg_on, dll.cg_off


def _build_toggle(where: str) -> str:
    src, lib = os.path.join(where, "toggle.c"), os.path.join(where, "toggle.so")
    with open(src, "w") as f:
        f.write("#include <valgrind/callgrind.h>\nvoid cg_on(void) { CALLGRIND_TOGGLE_COLLECT; }\n"
                "void cg_off(void) { CALLGRIND_TOGGLE_COLLECT; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", lib, src], check=True)
    return lib


def run_case(case: str, rounds: int) -> None:
    import asyncio

    import numpy as np

    import aioccl

    if case == "dist_all_reduce":
        import torch
        import torch.distributed as dist

        from aioccl.bootstrap.ports import reserve

        held = reserve("127.0.0.1")
        port = held.port
        held.close()  # (free for the store to bind, a moment later)
        dist.init_process_group("aioccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        t = torch.ones(2, dtype=torch.float32)
        for _ in range(3):  # the first call of a form teaches it: not counted
            dist.all_reduce(t)
        on, off = _collection()
        on()
        for _ in range(rounds):
            dist.all_reduce(t)
        off()
        dist.destroy_process_group()
        return

    async def main() -> None:
        n = 2 if case == "isend_irecv" else 1
        uid = aioccl.UniqueId.new(host="127.0.0.1")
        comms = await asyncio.gather(*(aioccl.Communicator.create(uid, r, n) for r in range(n)))
        x, out = np.ones(2, np.float32), np.zeros(2, np.float32)
        a = comms[0]
        for _ in range(3):  # the first call of a form teaches it: not counted
            if case == "isend_irecv":
                comms[0].isend(x, 1)
                await comms[1].irecv(out, 0)
            else:
                await a.all_reduce(x, out=out if case == "all_reduce_out" else None)
        on, off = _collection()
        on()
        # a call the lanes finish gives a Work born done: not awaited here, so no loop turn (whose count
        # depends on the clock, AIOCCL's fairness rule, and so on how slow callgrind runs) enters the count
        if case == "all_reduce":
            for _ in range(rounds):
                comms[0].all_reduce(x)
        elif case == "all_reduce_out":  # (one rank: the general way, through the engine: awaited)
            for _ in range(rounds):
                await comms[0].all_reduce(x, out=out)
        else:
            a, b = comms
            for _ in range(rounds):  # the send first: the receive finds its message in the FIFO, no spin
                a.isend(x, 1)
                b.irecv(out, 0)
        off()
        await asyncio.gather(*(c.close() for c in comms))

    asyncio.run(main())


def count(case: str, rounds: int, tree: str | None) -> int:
    """callgrind's instructions for the loop of one run of ``rounds`` calls."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "cg.out")
        cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no", f"--callgrind-out-file={out}",
               sys.executable, __file__,
               "--case", case, "--rounds", str(rounds), "--child"] + (["--tree", tree] if tree else [])
        env = {**os.environ, "PYTHONHASHSEED": "0", "AIOCCL_CG_TOGGLE": _build_toggle(d)}
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env)
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
    total = count(args.case, args.rounds, args.tree)
    print(f"{args.case} {args.tree or 'this tree'}: {total / args.rounds:.0f} instructions per call")


if __name__ == "__main__":
    main()
