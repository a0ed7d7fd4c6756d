"""Same-host schedules: lockstep ``Step`` s of *stage, publish, wait, read*.

On one host a rank can read its peers' memory, so instead of messages a
collective is a sequence of lockstep steps (the same ``Step`` of
``.schedule`` that message algorithms use), executed by every rank of the
communicator together:

1. **stage**: copy regions of my buffers into my slot (half ``s % 2`` of my
   segment's staging area); skipped for a registered buffer (``comm.alloc``)
   when the schedule allows zero-copy, because peers can then read it where
   it lies;
2. **publish**: set my step counter to ``s``;
3. **wait**: until the ranks named in ``wait`` have published ``s``;
4. **read**: ``Fetch`` (copy) or ``Reduce`` (combine) peers'
   staged regions into my OUT or SCRATCH.

The two slot halves alternate by step, and a rank stages for step ``s`` only
after every peer has published ``s - 1``; since every rank finishes its
reads of step ``s - 2`` before it publishes ``s - 1``, a slot is never
overwritten while someone reads it, with no extra synchronisation. The
first step of every op waits for all ranks, which also lets every rank check
that all issued the same op (see ``aioccl.engine.shm.channel``).

Algorithms (``cap`` = slot half in elements; larger ops run in chunks):

- ``flat``: one step per chunk; every rank reduces all ranks' chunk itself.
  Fewest synchronisations: the latency algorithm.
- ``direct`` (DESIGN.md): per chunk, step A reduces my 1/N slice across all
  ranks, step B fetches everyone's reduced slices. Each rank reads each byte
  once: the bandwidth algorithm.
- broadcast, all_gather, reduce_scatter, gather, scatter and all_to_all fetch
  exactly what they need in one step per chunk; barrier is one empty step;
  scan (``flat``) reduces ranks 0..r's chunks in rank order on rank r.

Like ``.schedule`` this is pure data; ``.reference`` style checks run it
in-process (``tests/test_shm_algorithms.py``) and the engine runs it over
real segments.
"""

from __future__ import annotations

from functools import lru_cache

from .schedule import IN, OUT, SCRATCH, Fetch, Reduce, Region, Schedule, Src, Stage, Step, pieces, split
from .table import TABLE

SHM_ALGORITHMS = {c.name: c.shm for c in TABLE}


def _step(rank: int, stage: tuple[Stage, ...], reads: tuple[Fetch | Reduce, ...],
          scale: tuple[Region, ...] = ()) -> Step:
    peers = set()
    for rd in reads:
        for s in (rd.srcs if isinstance(rd, Reduce) else (rd.src,)):
            peers.add(s.rank)
    peers.discard(rank)
    return Step(stage=stage, wait=tuple(sorted(peers)), reads=reads, scale=scale, lockstep=True)


def _all_reduce(count: int, rank: int, n: int, cap: int, algo: str, root: int | None) -> Schedule:
    """all_reduce, or reduce onto ``root`` when it is given."""
    steps = []
    every = range(n)
    if algo == "flat":
        for a, b in pieces(count, cap):
            chunk = Region(IN, a, b)
            mine = root is None or rank == root
            stage: tuple[Stage, ...] = (Stage(chunk, 0),) if (root is None or rank != root) else ()
            srcs = tuple(Src(j, chunk, 0) for j in every)
            reduces: tuple[Reduce, ...] = (Reduce(srcs, Region(OUT, a, b)),) if mine else ()
            steps.append(_step(rank, stage, reduces, (Region(OUT, a, b),) if mine else ()))
        return Schedule(tuple(steps), algo="flat")
    width = -(-min(cap, max(count, 1)) // n)
    for a, b in pieces(count, cap):
        sl = split(b - a, n)
        s0, s1 = sl[rank]
        # step A: reduce my slice of the chunk across all ranks
        keep = root is None or rank == root
        dst = Region(OUT, a + s0, a + s1) if keep else Region(SCRATCH, 0, s1 - s0)
        srcs = tuple(Src(j, Region(IN, a + s0, a + s1), s0) for j in every)
        steps.append(_step(rank, (Stage(Region(IN, a, b), 0),), (Reduce(srcs, dst),), (dst,)))
        # step B: fetch the others' reduced slices (everyone, or only the root)
        reads: tuple[Fetch, ...]
        if root is None:
            reads = tuple(Fetch(Src(j, Region(OUT, a + sl[j][0], a + sl[j][1]), 0),
                                Region(OUT, a + sl[j][0], a + sl[j][1])) for j in every if j != rank)
            steps.append(_step(rank, (Stage(dst, 0),), reads))
        elif rank == root:
            reads = tuple(Fetch(Src(j, Region(SCRATCH, 0, sl[j][1] - sl[j][0]), 0),
                                Region(OUT, a + sl[j][0], a + sl[j][1])) for j in every if j != rank)
            steps.append(_step(rank, (), reads))
        else:
            steps.append(_step(rank, (Stage(dst, 0),), ()))
    return Schedule(tuple(steps), scratch=0 if root is None else width, algo="direct")


def _scan(count: int, rank: int, cap: int, in_place: bool) -> Schedule:
    """Inclusive scan: rank r reduces ranks 0..r's staged chunks in rank order, as the chain folds them
    (``prefix.py``), so either way gives the same bits; an average divides by r + 1. In place, peers read
    staged copies (I overwrite my input while they may still read it)."""
    steps = []
    for a, b in pieces(count, cap):
        chunk = Region(IN, a, b)
        out = Region(OUT, a, b)
        srcs = tuple(Src(j, chunk, 0) for j in range(rank + 1))
        steps.append(_step(rank, (Stage(chunk, 0),), (Reduce(srcs, out),), (out,)))
    return Schedule(tuple(steps), zero_copy=not in_place, algo="flat", divisor=rank + 1)


def _blockwise(coll: str, block: int, rank: int, n: int, root: int, cap: int, in_place: bool) -> Schedule:
    """The collectives that move per-rank blocks of ``block`` elements."""
    steps = []
    every = range(n)
    per_block = max(1, cap // n)
    for a, b in pieces(block, cap if coll in ("all_gather", "gather") else per_block):
        w = b - a

        def blk(j: int, buf: int = IN, a: int = a, b: int = b) -> Region:
            return Region(buf, j * block + a, j * block + b)

        if coll == "all_gather":
            steps.append(_step(rank, (Stage(Region(IN, a, b), 0),),
                               tuple(Fetch(Src(j, Region(IN, a, b), 0), blk(j, OUT)) for j in every)))
        elif coll == "gather":
            stage: tuple[Stage, ...] = (Stage(Region(IN, a, b), 0),) if rank != root else ()
            reads = tuple(Fetch(Src(j, Region(IN, a, b), 0), blk(j, OUT)) for j in every) if rank == root else ()
            steps.append(_step(rank, stage, reads))
        elif coll == "scatter":
            stage = tuple(Stage(blk(j), j * w) for j in every if j != root) if rank == root else ()
            steps.append(_step(rank, stage, (Fetch(Src(root, blk(rank), rank * w), Region(OUT, a, b)),)))
        elif coll == "all_to_all":
            stage = tuple(Stage(blk(j), j * w) for j in every if j != rank)
            steps.append(_step(rank, stage, tuple(Fetch(Src(j, blk(rank), rank * w), blk(j, OUT)) for j in every)))
        elif coll == "reduce_scatter":
            stage = tuple(Stage(blk(j), j * w) for j in every if j != rank)
            out = Region(OUT, a, b)
            steps.append(_step(rank, stage, (Reduce(tuple(Src(j, blk(rank), rank * w) for j in every), out),),
                               (out,)))
        else:
            raise ValueError(f"not a block-wise collective: {coll!r}")
    # in-place all_to_all overwrites the very blocks peers read: they must read staged copies
    return Schedule(tuple(steps), zero_copy=not (coll == "all_to_all" and in_place), algo="direct")


@lru_cache(maxsize=4096)
def shm_plan(coll: str, count: int, rank: int, n: int, root: int, cap: int, algo: str = "direct",
             in_place: bool = False) -> Schedule:
    """One rank's shared-memory schedule; ``count`` as in ``aioccl.algorithms.plan()``,
    ``cap`` the slot half in elements (the same on every rank)."""
    if cap < 1:
        raise ValueError("cap must be at least one element")
    if coll == "all_reduce":
        sched = _all_reduce(count, rank, n, cap, algo, None)
        # flat in place: I overwrite my whole buffer while peers may still read it
        return sched if not (algo == "flat" and in_place) else Schedule(sched.steps, 0, False, "flat")
    if coll == "reduce":
        return _all_reduce(count, rank, n, cap, algo, root)
    if coll == "broadcast":
        steps = tuple(_step(rank, (Stage(Region(IN, a, b), 0),) if rank == root else (),
                            (Fetch(Src(root, Region(IN, a, b), 0), Region(OUT, a, b)),))
                      for a, b in pieces(count, cap))
        return Schedule(steps, algo="direct")
    if coll == "barrier":
        return Schedule((Step(lockstep=True),), algo="direct")
    if coll == "scan":
        return _scan(count, rank, cap, in_place)
    return _blockwise(coll, count, rank, n, root, cap, in_place)


__all__ = ["SHM_ALGORITHMS", "shm_plan"]
