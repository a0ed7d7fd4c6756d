"""What a failure leaves at exit: one error, and a warning only for a failure the app was not told of.

Rank 1 posts receives ahead from rank 0 (a pipeline always has some) and one with a short deadline that
nobody sends to and nobody awaits; rank 0 then dies (SIGKILL). Rank 1 awaits its first receive and gets
PeerLost; it exits without awaiting the rest. At exit the receives that failed with that same loss are not
reported again; the timed-out one is, once, at the line that posted it (RECV-LINE, printed first).

Run as: aioccl-run --keep-going --nproc-per-node 2 tests/workers/exit_report.py
"""

from __future__ import annotations

import asyncio
import inspect
import os
import signal

import numpy as np

import aioccl


async def main() -> None:
    comm = await aioccl.init(timeout=30)
    await comm.barrier()
    if comm.rank == 0:
        await asyncio.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    bufs = [np.zeros(4) for _ in range(4)]
    ahead = [comm.irecv(b, 0, tag=k) for k, b in enumerate(bufs[:3])]  # posted ahead
    print(f"RECV-LINE {inspect.currentframe().f_lineno + 1}", flush=True)  # type: ignore[union-attr]
    comm.irecv(bufs[3], 1 - comm.rank, tag=7, timeout=0.1)  # nobody sends it, nobody awaits it
    try:
        await ahead[0]
    except aioccl.PeerLost as e:
        print(f"GOT {type(e).__name__}: {e}", flush=True)
    await asyncio.sleep(0.3)  # (the timed-out receive fails meanwhile)


asyncio.run(main())
