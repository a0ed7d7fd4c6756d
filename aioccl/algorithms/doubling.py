"""Recursive doubling: log2(n) steps, whole buffer each step; best for small messages.

Non-powers of two fold the first ``2*(n-p)`` ranks in pairs before the
doubling and unfold after (the classic MPICH scheme). Every combine is
``op(mine, theirs)`` on one side and ``op(theirs, mine)`` on the other;
IEEE add, multiply, min and max are commutative, so all ranks end bit-identical.
"""

from __future__ import annotations

from .schedule import IN, OUT, SCRATCH, Copy, Recv, RecvReduce, Region, Schedule, Send, Step, build


def all_reduce(count: int, rank: int, n: int) -> Schedule:
    whole_in, whole_out = Region(IN, 0, count), Region(OUT, 0, count)
    tmp = Region(SCRATCH, 0, count)
    p = 1 << (n.bit_length() - 1)
    rem = n - p
    steps: list[Step] = []
    if rank < 2 * rem and rank % 2 == 0:
        # folded away: hand the input to the odd neighbour, get the result back
        steps.append(Step(sends=(Send(rank + 1, whole_in),)))
        steps.append(Step(recvs=(Recv(rank + 1, whole_out),)))
        return build(steps, scratch=0, scale=(whole_out,), algo="rd")
    if rank < 2 * rem:
        steps.append(Step(recvs=(RecvReduce(rank - 1, whole_out, whole_in, tmp),)))
        vrank = rank // 2
    else:
        steps.append(Step(copies=(Copy(whole_in, whole_out),)))
        vrank = rank - rem

    def real(v: int) -> int:
        return v * 2 + 1 if v < rem else v + rem

    mask = 1
    while mask < p:
        partner = real(vrank ^ mask)
        steps.append(Step(sends=(Send(partner, whole_out),),
                            recvs=(RecvReduce(partner, whole_out, whole_out, tmp),)))
        mask <<= 1
    if rank < 2 * rem:
        steps.append(Step(sends=(Send(rank - 1, whole_out),)))
    return build(steps, scratch=count if n > 1 else 0, scale=(whole_out,), algo="rd")
