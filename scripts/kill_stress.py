"""Kill a rank at random points, many times over: every survivor must end cleanly, never by a signal.

    python scripts/kill_stress.py --cycles 200 --transport shm --ranks 2
    python scripts/kill_stress.py --cycles 200 --transport tcp --ranks 3

Each cycle forks fresh ranks (aioccl and numpy imported once, before any thread), lets them run a mix of
collectives and point-to-point ops of several sizes (registered buffers read in place included), then
SIGKILLs one rank at a random moment. A survivor must see ``PeerLost`` (or another aioccl error) and exit 0
within its deadline; an exit by a signal (SIGSEGV, SIGABRT, SIGBUS) or a hang fails the cycle, with the
survivor's faulthandler traceback. Prints one line per failure and a summary; exits 1 if any cycle failed.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import random
import signal
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import aioccl  # noqa: E402

TRANSPORTS = {"shm": {"AIOCCL_SHM_DISABLE": "0", "AIOCCL_NET": "socket"},
              "tcp": {"AIOCCL_SHM_DISABLE": "1", "AIOCCL_NET": "socket"}}
CLEAN, ERRORED = 0, 3


def rank_main(rank: int, n: int, uids: Any, ready: Any, seed: int) -> None:
    import faulthandler

    faulthandler.enable()
    rng = random.Random(seed)  # the same op sequence on every rank
    jitter = random.Random(seed * 31 + rank)  # pauses of each rank's own
    uid = aioccl.UniqueId.new(host="127.0.0.1") if rank == 0 else None
    if rank == 0:
        for _ in range(n - 1):
            uids.put(str(uid))
    else:
        uid = aioccl.UniqueId.parse(uids.get(timeout=30))
    try:
        comm = aioccl.Communicator.create_sync(uid, rank, n, timeout=20)
        reg = comm.alloc(1 << 16, np.float32)  # registered: peers read it in place over shared memory
    except BaseException as e:  # noqa: BLE001
        print(f"rank {rank}: could not form: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(ERRORED)
    ready.put(rank)
    try:
        step = 0
        while True:
            size = rng.choice([1, 100, 1 << 14, 1 << 18])
            x = np.full(size, rank + 1, np.float32)
            comm.all_reduce(x, timeout=10).wait()
            reg[:] = rank
            comm.all_reduce(reg, timeout=10).wait()
            if n > 1:
                got = np.empty(size, np.float32)
                r = comm.irecv(got, (rank - 1) % n, timeout=10)
                s = comm.isend(x, (rank + 1) % n, timeout=10)
                r.wait()
                s.wait()
            comm.all_gather(np.arange(8, dtype=np.int64), timeout=10).wait()
            if jitter.random() < 0.3:
                time.sleep(jitter.uniform(0, 0.003))  # "between steps"
            step += 1
    except aioccl.AiocclError as e:
        if os.environ.get("KILL_STRESS_VERBOSE"):
            print(f"rank {rank} step {step}: {type(e).__name__}: {str(e).splitlines()[0]}", file=sys.stderr, flush=True)
        os._exit(CLEAN)  # what a survivor should see
    except BaseException as e:  # noqa: BLE001
        print(f"rank {rank}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(ERRORED)


def torch_rank_main(rank: int, n: int, uids: Any, ready: Any, seed: int) -> None:
    """The issue's scenario: DDP training on ``backend="aioccl"``, a rank killed between steps."""
    import faulthandler

    import torch
    import torch.distributed as dist

    import aioccl.interop.c10d

    faulthandler.enable()
    torch.manual_seed(seed)
    jitter = random.Random(seed * 31 + rank)
    aioccl.interop.c10d.register()
    try:
        store = dist.FileStore(uids, n)  # here ``uids`` is the cycle's store file
        dist.init_process_group("aioccl", store=store, rank=rank, world_size=n)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
            torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
    except BaseException as e:  # noqa: BLE001
        print(f"rank {rank}: could not form: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(ERRORED)
    ready.put(rank)
    try:
        while True:
            x = torch.randn(32, 64)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if jitter.random() < 0.5:
                time.sleep(jitter.uniform(0, 0.005))  # between steps
    except Exception as e:  # noqa: BLE001 - torch wraps ours (DistBackendError, RuntimeError)
        if os.environ.get("KILL_STRESS_VERBOSE"):
            print(f"rank {rank}: {type(e).__name__}: {str(e).splitlines()[0]}", file=sys.stderr, flush=True)
        os._exit(CLEAN)


def cycle(n: int, seed: int, rng: random.Random, use_torch: bool = False) -> str:
    """'' when every survivor ended cleanly, else what went wrong."""
    ctx = mp.get_context("fork")
    uids: Any = ctx.Queue()
    ready = ctx.Queue()
    target: Any = rank_main
    if use_torch:
        import tempfile

        uids, target = tempfile.mktemp(prefix="aioccl-kill-stress-"), torch_rank_main
    procs = [ctx.Process(target=target, args=(r, n, uids, ready, seed), daemon=True) for r in range(n)]
    try:
        return _run_cycle(procs, n, ready, rng)
    finally:
        if isinstance(uids, str):  # torch's file store: gone with its cycle
            with contextlib.suppress(FileNotFoundError):
                os.unlink(uids)


def _run_cycle(procs: list[Any], n: int, ready: Any, rng: random.Random) -> str:
    for p in procs:
        p.start()
    formed = []
    try:
        for _ in range(n):
            formed.append(ready.get(timeout=30))
    except Exception:  # noqa: BLE001
        codes = [p.exitcode for p in procs]
        for p in procs:
            p.kill()
        return f"the ranks did not form a communicator (ready: {formed}, exit codes {codes})"
    time.sleep(rng.uniform(0.0, 0.4))
    victim = rng.randrange(n)
    os.kill(procs[victim].pid, signal.SIGKILL)
    problems = []
    for r, p in enumerate(procs):
        p.join(timeout=40 if r != victim else 5)
        if r == victim:
            continue
        if p.exitcode is None:
            p.kill()
            problems.append(f"rank {r} hung after rank {victim} was killed")
        elif p.exitcode < 0:
            problems.append(f"rank {r} died of {signal.Signals(-p.exitcode).name} after rank {victim} was killed")
        elif p.exitcode != CLEAN:
            problems.append(f"rank {r} exited {p.exitcode} after rank {victim} was killed")
    return "; ".join(problems)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--cycles", type=int, default=200)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--transport", choices=sorted(TRANSPORTS), default="shm")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--torch", action="store_true", help="DDP training on backend=\"aioccl\" (the issue's case)")
    ns = ap.parse_args()
    os.environ.update(TRANSPORTS[ns.transport], AIOCCL_WATCHDOG_S="60")
    if ns.torch:
        import torch  # noqa: F401 - imported once here, before the forks, as aioccl and numpy are
    rng = random.Random(ns.seed)
    failures = 0
    t0 = time.monotonic()
    for c in range(ns.cycles):
        problem = cycle(ns.ranks, ns.seed * 100003 + c, rng, ns.torch)
        if problem:
            failures += 1
            print(f"cycle {c}: {problem}", flush=True)
    print(f"KILL_STRESS {ns.cycles} cycles, {ns.ranks} ranks, {ns.transport}{' torch DDP' if ns.torch else ''}: "
          f"{failures} failed "
          f"({time.monotonic() - t0:.0f} s)", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
