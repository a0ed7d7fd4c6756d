"""A training job under ``torchrun --max-restarts K`` whose ranks fail on early attempts.

    torchrun --nproc-per-node 2 --max-restarts 2 torch_restart.py MODE FAILS

``MODE``: ``raise`` (rank 1 raises after a first step), ``init`` (rank 1 dies in the middle of
``init_process_group``, after rank 0 has published its unique id). Attempts ``0 .. FAILS-1`` fail; the next
one must form its group and finish, as it does on Gloo: prints ``RESTART_OK attempt=<n>`` on every rank.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

import aioccl.interop.c10d

mode, fails = sys.argv[1], int(sys.argv[2])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
rank = int(os.environ["RANK"])
failing = attempt < fails and rank == 1
aioccl.interop.c10d.register()  # from a checkout, the entry point may not be installed
if failing and mode == "init":
    time.sleep(1.0)  # rank 0 is inside init_process_group: its unique id is in the store, its root up
    os._exit(3)
t0 = time.monotonic()
dist.init_process_group("aioccl")
x = torch.full((4,), float(rank + 1))
dist.all_reduce(x)
assert x.tolist() == [3.0] * 4, x
if failing:
    raise RuntimeError(f"rank 1 fails on attempt {attempt}, as planned")
dist.all_reduce(x)
assert x.tolist() == [6.0] * 4, x
print(f"RESTART_OK attempt={attempt} rank={rank} formed in {time.monotonic() - t0:.1f}s", flush=True)
dist.destroy_process_group()
