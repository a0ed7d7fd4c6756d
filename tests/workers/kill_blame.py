"""Four ranks in a ring, large messages flowing between all neighbours; one is killed: who is blamed?

Each rank sends 2 MiB to both neighbours and receives 2 MiB from both, over and over. Rank KILLED (argv[1])
kills itself (SIGKILL) at step 5. Each survivor, at its first error, prints it and calls abort() (as a
program whose exception ends it does), so that the others may learn of the failure through that abort
before their own connection to the killed rank ends. Every survivor's error must name the killed rank as
the one lost (docs/troubleshooting.md): never a live rank that aborted because of it.

Run as: aioccl-run --keep-going --nproc-per-node 4 tests/workers/kill_blame.py KILLED
Prints BLAME rank R: <the error> on each survivor.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import numpy as np

import aioccl

KILLED = int(sys.argv[1])
COUNT = (2 << 20) // 8  # float64: 2 MiB a message (past AIOCCL_P2P_EAGER: a rendezvous)


async def main() -> None:
    comm = await aioccl.init(timeout=30)
    n, r = comm.world_size, comm.rank
    left, right = (r - 1) % n, (r + 1) % n
    out = np.full(COUNT, float(r))
    ins = [np.empty(COUNT) for _ in range(2)]
    await comm.barrier()
    try:
        for step in range(100_000):
            if r == KILLED and step == 5:
                os.kill(os.getpid(), signal.SIGKILL)
            ops = [comm.irecv(ins[0], left, tag=1, timeout=30), comm.irecv(ins[1], right, tag=2, timeout=30),
                   comm.isend(out, right, tag=1, timeout=30), comm.isend(out, left, tag=2, timeout=30)]
            await asyncio.gather(*ops)
            assert (ins[0] == left).all() and (ins[1] == right).all()
    except aioccl.AiocclError as e:
        print(f"BLAME rank {r}: {type(e).__name__}: {e}", flush=True)
        comm.abort()
        return
    raise SystemExit("the ring ended by itself")


asyncio.run(main())
