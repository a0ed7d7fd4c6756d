"""Direct (one-step, all-pairs) schedules: gather, scatter, all_to_all, and the barrier."""

from __future__ import annotations

from .schedule import IN, OUT, SCRATCH, Copy, Recv, Region, Schedule, Send, Step


def gather(block: int, rank: int, n: int, root: int) -> Schedule:
    if rank != root:
        return Schedule((Step(sends=(Send(root, Region(IN, 0, block)),)),), algo="direct")
    outs = [Region(OUT, j * block, (j + 1) * block) for j in range(n)]
    return Schedule((Step(copies=(Copy(Region(IN, 0, block), outs[root]),),
                           recvs=tuple(Recv(j, outs[j]) for j in range(n) if j != root)),), algo="direct")


def scatter(block: int, rank: int, n: int, root: int) -> Schedule:
    if rank != root:
        return Schedule((Step(recvs=(Recv(root, Region(OUT, 0, block)),)),), algo="direct")
    ins = [Region(IN, j * block, (j + 1) * block) for j in range(n)]
    return Schedule((Step(copies=(Copy(ins[root], Region(OUT, 0, block)),),
                           sends=tuple(Send(j, ins[j]) for j in range(n) if j != root)),), algo="direct")


def all_to_all(block: int, rank: int, n: int, in_place: bool) -> Schedule:
    """Everyone sends block j to rank j at once; in place receives go through scratch first."""
    order = [(rank + k) % n for k in range(1, n)]  # stagger peers so no rank is hit by all at once
    sends = tuple(Send(j, Region(IN, j * block, (j + 1) * block)) for j in order)
    outs = [Region(OUT, j * block, (j + 1) * block) for j in range(n)]
    if not in_place:
        return Schedule((Step(copies=(Copy(Region(IN, rank * block, (rank + 1) * block), outs[rank]),),
                               sends=sends, recvs=tuple(Recv(j, outs[j]) for j in order)),), algo="direct")
    slot = {j: Region(SCRATCH, i * block, (i + 1) * block) for i, j in enumerate(order)}
    return Schedule((
        Step(sends=sends, recvs=tuple(Recv(j, slot[j]) for j in order)),
        Step(copies=tuple(Copy(slot[j], outs[j]) for j in order)),
    ), scratch=(n - 1) * block, algo="direct")


def barrier(rank: int, n: int) -> Schedule:
    """Dissemination barrier: ceil(log2 n) steps of empty messages."""
    steps, k = [], 1
    empty = Region(OUT, 0, 0)
    while k < n:
        steps.append(Step(sends=(Send((rank + k) % n, empty),), recvs=(Recv((rank - k) % n, empty),)))
        k <<= 1
    return Schedule(tuple(steps), algo="dissemination")
