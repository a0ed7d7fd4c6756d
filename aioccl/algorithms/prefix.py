"""Prefix reductions: ``scan``, an inclusive scan over the ranks (``MPI_Scan``).

Rank r gets ``x_0 op x_1 op ... op x_r``. The chain is the one order that
folds in rank order on every rank, so each result is bit-identical to a
sequential fold whatever the dtype: rank r waits for rank r-1's prefix,
combines its own input in and hands the result on. That is n - 1 hops; a
scan is a latency op in practice (small vectors), where a log-depth tree
would need other groupings, and so other float results, on some ranks.
"""

from __future__ import annotations

from dataclasses import replace

from .schedule import IN, OUT, SCRATCH, Copy, RecvReduce, Region, Schedule, Send, Step


def scan(count: int, rank: int, n: int) -> Schedule:
    """Rank ``rank``'s part of an inclusive scan of ``count`` elements over ``n`` ranks (algorithm ``chain``).

    An average divides rank r's prefix by r + 1, the ranks it covers (``Schedule.divisor``), after the
    step that passed the sum on (the contract runs ``scale`` once the step's messages are done)."""
    mine, out = Region(IN, 0, count), Region(OUT, 0, count)
    recvs = (RecvReduce(rank - 1, out, out, Region(SCRATCH, 0, count)),) if rank else ()
    steps = [Step(copies=(Copy(mine, out),), recvs=recvs)]
    if rank + 1 < n:
        steps.append(Step(sends=(Send(rank + 1, out),)))
    steps[-1] = replace(steps[-1], scale=(out,))
    return Schedule(tuple(steps), scratch=count if rank else 0, algo="chain", divisor=rank + 1)
