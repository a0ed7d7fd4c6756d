"""Ring algorithms: bandwidth-optimal, 2(n-1) steps for all_reduce.

Each rank talks only to its neighbours ``rank-1`` and ``rank+1``, so every
link carries ``(n-1)/n`` of the data in each phase. Large buffers are cut
into pieces of at most ``chunk`` elements per segment and the ring runs piece
by piece, which bounds the scratch memory to a few chunks.
"""

from __future__ import annotations

from .schedule import IN, OUT, SCRATCH, Copy, Recv, RecvReduce, Region, Schedule, Send, Step, build, pieces, split


def _reduce_scatter_steps(
    segs: list[Region], rank: int, n: int, acc_for: list[Region], tmp: Region, shift: int,
) -> list[Step]:
    """Ring reduce-scatter over ``segs`` (one per rank-position).

    At step t rank r sends segment (r+shift-t) and receives (r+shift-t-1),
    accumulating ``acc_for[s] = op(IN[s], incoming)``. After n-1 steps rank r
    holds the full reduction of segment (r+shift+1) % n in ``acc_for`` of it.
    """
    left, right = (rank - 1) % n, (rank + 1) % n
    steps = []
    for t in range(n - 1):
        s_send = (rank + shift - t) % n
        s_recv = (rank + shift - t - 1) % n
        src_send = segs[s_send] if t == 0 else acc_for[s_send]
        seg = segs[s_recv]
        steps.append(Step(
            sends=(Send(right, src_send),),
            recvs=(RecvReduce(left, acc_for[s_recv], seg, Region(SCRATCH, tmp.start, tmp.start + seg.count)),),
        ))
    return steps


def _all_gather_steps(segs: list[Region], rank: int, n: int, first_owned: int) -> list[Step]:
    """Ring all-gather: rank r starts owning segment (r+first_owned) of OUT."""
    left, right = (rank - 1) % n, (rank + 1) % n
    return [
        Step(sends=(Send(right, segs[(rank + first_owned - t) % n]),),
              recvs=(Recv(left, segs[(rank + first_owned - t - 1) % n]),))
        for t in range(n - 1)
    ]


def _copy_only(count: int) -> Schedule:
    """One rank: the result is the input."""
    return Schedule((Step(copies=(Copy(Region(IN, 0, count), Region(OUT, 0, count)),)),), algo="ring")


def _scratch_layout(c: int) -> tuple[Region, tuple[Region, Region]]:
    """Scratch of a reduce-scatter with chunk ``c``: the incoming chunk, then two accumulators."""
    return Region(SCRATCH, 0, c), (Region(SCRATCH, c, 2 * c), Region(SCRATCH, 2 * c, 3 * c))


def _accumulators(segs: list[Region], rank: int, n: int, accs: tuple[Region, Region],
                  final: Region | None) -> list[Region]:
    """Where a reduce-scatter with ``shift=-1`` accumulates each received segment.

    The segment received at step t goes to ``accs[t % 2]`` (two, so the partial
    sum being sent is never the one being written); the last one, which is
    this rank's own fully reduced segment, goes to ``final`` when given.
    """
    acc_for = [Region(SCRATCH, 0, 0)] * n
    for t in range(n - 1):
        s = (rank - 1 - t - 1) % n
        a = accs[t % 2]
        last = t == n - 2
        acc_for[s] = final if last and final is not None else Region(SCRATCH, a.start, a.start + segs[s].count)
    return acc_for


def all_reduce(count: int, rank: int, n: int, chunk: int) -> Schedule:
    if n == 1:
        return _copy_only(count)
    steps: list[Step] = []
    for lo, hi in pieces(count, chunk * n):
        ranges = split(hi - lo, n)
        ins = [Region(IN, lo + a, lo + b) for a, b in ranges]
        outs = [Region(OUT, lo + a, lo + b) for a, b in ranges]
        tmp = Region(SCRATCH, 0, max(b - a for a, b in ranges))
        steps += _reduce_scatter_steps(ins, rank, n, outs, tmp, shift=0)
        steps += _all_gather_steps(outs, rank, n, first_owned=1)
    return build(steps, scratch=min(count, chunk) if count else 0,
             scale=(Region(OUT, 0, count),), algo="ring")


def reduce_scatter(block: int, rank: int, n: int, chunk: int) -> Schedule:
    """IN holds n blocks of ``block`` elements; rank r ends with block r in OUT.

    Partial sums live in two alternating scratch accumulators so IN is only
    read: the caller's input stays intact except where OUT aliases it.
    """
    if n == 1:
        return _copy_only(block)
    steps: list[Step] = []
    c = min(block, chunk) if block else 0
    tmp, accs = _scratch_layout(c)
    for lo, hi in pieces(block, chunk):
        segs = [Region(IN, j * block + lo, j * block + hi) for j in range(n)]
        acc_for = _accumulators(segs, rank, n, accs, final=Region(OUT, lo, hi))
        steps += _reduce_scatter_steps(segs, rank, n, acc_for, tmp, shift=-1)
    return build(steps, scratch=3 * c, scale=(Region(OUT, 0, block),), algo="ring")


def all_gather(block: int, rank: int, n: int) -> Schedule:
    outs = [Region(OUT, j * block, (j + 1) * block) for j in range(n)]
    first = Step(copies=(Copy(Region(IN, 0, block), outs[rank]),))
    return Schedule((first, *_all_gather_steps(outs, rank, n, first_owned=0)), algo="ring")


def reduce(count: int, rank: int, n: int, root: int, chunk: int) -> Schedule:
    """Reduce for large buffers: ring reduce-scatter, then every rank sends its segment to root.

    Non-root ranks accumulate in scratch only: their IN and OUT stay untouched.
    """
    if n == 1:
        return _copy_only(count)
    steps: list[Step] = []
    c = min(count, chunk) if count else 0
    tmp, accs = _scratch_layout(c)
    for lo, hi in pieces(count, chunk * n):
        ranges = split(hi - lo, n)
        segs = [Region(IN, lo + a, lo + b) for a, b in ranges]
        outs = [Region(OUT, lo + a, lo + b) for a, b in ranges]
        acc_for = _accumulators(segs, rank, n, accs, final=outs[rank] if rank == root else None)
        steps += _reduce_scatter_steps(segs, rank, n, acc_for, tmp, shift=-1)
        if rank == root:
            steps.append(Step(recvs=tuple(Recv(j, outs[j]) for j in range(n) if j != root)))
        else:
            steps.append(Step(sends=(Send(root, acc_for[rank]),)))
    scale = (Region(OUT, 0, count),) if rank == root else ()
    return build(steps, scratch=3 * c, scale=scale, algo="ring")
