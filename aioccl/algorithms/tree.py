"""Binomial trees (latency: log2(n) steps) and a pipelined chain (bandwidth) for rooted ops.

Ranks are renumbered relative to the root (``v = (rank - root) % n``) so the
root is always virtual rank 0.
"""

from __future__ import annotations

from .schedule import IN, OUT, SCRATCH, Copy, Recv, RecvReduce, Region, Schedule, Send, Step, build, pieces


def _real(v: int, root: int, n: int) -> int:
    return (v + root) % n


def _children(v: int, n: int) -> list[int]:
    """Virtual children of v in a binomial tree, largest subtree first."""
    out, mask = [], 1
    while mask < n and not v & mask:
        if v + mask < n:
            out.append(v + mask)
        mask <<= 1
    return out[::-1]


def _parent(v: int) -> int:
    return v - (v & -v)


def broadcast(count: int, rank: int, n: int, root: int) -> Schedule:
    """Root's IN reaches every OUT (root's too) in ceil(log2 n) steps; IN may be OUT."""
    v = (rank - root) % n
    whole = Region(OUT, 0, count)
    steps: list[Step] = []
    if v:
        steps.append(Step(recvs=(Recv(_real(_parent(v), root, n), whole),)))
    kids = _children(v, n)
    src = whole if v else Region(IN, 0, count)
    copies = () if v else (Copy(src, whole),)
    steps.append(Step(copies=copies, sends=tuple(Send(_real(c, root, n), src) for c in kids)))
    return Schedule(tuple(steps), algo="tree")


def broadcast_chain(count: int, rank: int, n: int, root: int, chunk: int) -> Schedule:
    """Pipelined chain root -> root+1 -> ...: each link carries the data once, chunk by chunk."""
    v = (rank - root) % n
    prev, nxt = _real(v - 1, root, n), _real(v + 1, root, n)
    chunks = pieces(count, chunk)
    steps: list[Step] = [] if v else [Step(copies=(Copy(Region(IN, 0, count), Region(OUT, 0, count)),))]
    src = OUT if v else IN
    for t in range(len(chunks) + n - 2):
        sends: tuple[Send, ...] = ()
        recvs: tuple[Recv, ...] = ()
        i_send, i_recv = t - v, t - (v - 1)
        if v < n - 1 and 0 <= i_send < len(chunks):
            sends = (Send(nxt, Region(src, *chunks[i_send])),)
        if v > 0 and 0 <= i_recv < len(chunks):
            recvs = (Recv(prev, Region(OUT, *chunks[i_recv])),)
        if sends or recvs:
            steps.append(Step(sends=sends, recvs=recvs))
    return Schedule(tuple(steps), algo="chain")


def reduce(count: int, rank: int, n: int, root: int) -> Schedule:
    """Binomial reduce; non-root ranks accumulate in scratch, so only the root's OUT changes."""
    v = (rank - root) % n
    whole_in = Region(IN, 0, count)
    acc = Region(OUT, 0, count) if v == 0 else Region(SCRATCH, count, 2 * count)
    tmp = Region(SCRATCH, 0, count)
    steps: list[Step] = []
    have = whole_in  # where this rank's partial result currently lives
    for c in reversed(_children(v, n)):  # smallest subtree first: it finishes first
        steps.append(Step(recvs=(RecvReduce(_real(c, root, n), acc, have, tmp),)))
        have = acc
    if v:
        steps.append(Step(sends=(Send(_real(_parent(v), root, n), have),)))
    elif have is whole_in:
        steps.append(Step(copies=(Copy(whole_in, acc),)))
    scratch = 0 if n == 1 else (count if v == 0 else 2 * count)
    return build(steps, scratch=scratch, scale=(acc,) if v == 0 else (), algo="tree")
