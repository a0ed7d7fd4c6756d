"""A trio program using aioccl across processes: init, every collective, a ring of sends, close.

Run as: aioccl-run --nproc-per-node N tests/workers/trio_app.py
"""

from __future__ import annotations

import os
import sys

import numpy as np
import trio

sys.path.insert(0, os.path.dirname(__file__))
import aioccl  # noqa: E402

from _check import DTYPES, Checker, data, poison, reduced  # noqa: E402


async def awaited(w: aioccl.Work) -> None:
    await w  # nurseries start coroutine functions; a Work is an awaitable


async def main() -> None:
    comm = await aioccl.init(timeout=60)
    ck = Checker(comm.rank)
    n, r = comm.world_size, comm.rank
    for dt in DTYPES:
        for count in (1, 1000):
            tag = f"{np.dtype(dt).name} count={count}"
            x = data(r, count, dt)
            got = await comm.all_reduce(x)
            ck.same(f"all_reduce {tag}", got, reduced(n, count, dt, "sum"))
            b = data(1, count, dt) if r == 1 else poison(count, dt)
            await comm.broadcast(b, root=1)
            ck.same(f"broadcast {tag}", b, data(1, count, dt))
            got = await comm.all_gather(data(r, count, dt))
            ck.same(f"all_gather {tag}", got, np.concatenate([data(j, count, dt) for j in range(n)]))
            got = await comm.reduce_scatter(data(r, n * count, dt))
            ck.same(f"reduce_scatter {tag}", got, reduced(n, n * count, dt, "sum")[r * count:(r + 1) * count])
            out = poison(count, dt)
            async with trio.open_nursery() as nursery:  # the two halves of a ring step, in two trio tasks
                nursery.start_soon(awaited, comm.irecv(out, (r - 1) % n))
                nursery.start_soon(awaited, comm.isend(data(r, count, dt), (r + 1) % n))
            ck.same(f"ring {tag}", out, data((r - 1) % n, count, dt))
    with trio.move_on_after(0.1):  # cancelling a trio task's await leaves the op to finish
        await comm.barrier()
    await comm.barrier()
    ck.true("engine on the proxy thread", comm.engine_placement == "thread")
    label = f"trio n={n} transport={comm.transport} engine={comm.engine_placement}"
    await comm.close()
    ck.finish(label)


if __name__ == "__main__":
    trio.run(main)
