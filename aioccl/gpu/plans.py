"""What each rank copies and reduces in a GPU collective: pure functions, no GPU, no I/O.

Same-host ranks share their *scratch* buffers through CUDA IPC. An op runs
in pieces that fit the scratch, each one lockstep ``Step`` of the one
schedule vocabulary (``aioccl.algorithms.schedule``), run in two phases
with a barrier after each:

1. **publish**: every rank that has input ``Stage`` s its part of the piece
   into its own scratch;
2. **consume**: every rank that gets output builds its part of the piece
   from the peers' scratch: ``Fetch`` one peer's span, or ``Reduce`` the
   same span of every rank's scratch, in rank order (so all ranks compute
   bit-identical results), then ``scale`` s it (avg).

Unlike the host's shared-memory steps, a GPU piece reads *every* source,
its own included, from the staged scratch (never a live buffer), so the
output may be the input without further care.

The published data of a piece is ``nblk`` blocks of the piece's length:
``nblk`` is 1 when the op moves one vector (all_reduce, reduce, broadcast,
all_gather, gather) and ``nranks`` when rank j's part is block j of the
input (reduce_scatter, scatter, all_to_all). Offsets count elements.
``tests/test_gpu_plans.py`` runs these plans with numpy for every op.

The staged path (ranks on other hosts) copies through pinned host memory
instead and lets the host engine move the bytes; ``stage_pieces()`` cuts
its elementwise ops into pieces so the copies overlap the transfers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..algorithms.schedule import IN, OUT, Fetch, Reduce, Region, Src, Stage, Step
from ..algorithms.table import TABLE

BLOCKED = tuple(c.name for c in TABLE if c.input_blocks)  # rank j's part is block j of the input
ROOT_PUBLISHES = tuple(c.name for c in TABLE if c.root_input_only)  # only the root has input
ROOT_CONSUMES = tuple(c.name for c in TABLE if c.root_output_only)  # only the root gets output


def ipc_pieces(name: str, rank: int, nranks: int, root: int, count: int, cap: int) -> list[Step]:
    """The pieces of op ``name`` for ``rank``; ``count`` is the per-block count (as in the CPU schedules),
    ``cap`` the scratch size in elements."""
    nblk = nranks if name in BLOCKED else 1
    width = max(1, cap // nblk)
    if cap < nblk:
        raise ValueError(f"scratch of {cap} elements cannot hold {nblk} blocks")
    publishes = rank == root if name in ROOT_PUBLISHES else True
    consumes = rank == root if name in ROOT_CONSUMES else True
    others = tuple(j for j in range(nranks) if j != rank)
    pieces = []
    for a in range(0, count, width):
        n = min(width, count - a)
        stage = tuple(Stage(Region(IN, j * count + a, j * count + a + n), j * n) for j in range(nblk)) \
            if publishes else ()
        reads = _consume(name, rank, nranks, root, count, a, n) if consumes else ()
        scale = tuple(rd.dst for rd in reads if isinstance(rd, Reduce))
        pieces.append(Step(stage=stage, wait=others, reads=reads, scale=scale, lockstep=True))
    return pieces


def _consume(name: str, rank: int, nranks: int, root: int, count: int, a: int, n: int) -> tuple[Fetch | Reduce, ...]:
    def src(j: int, block: int) -> Src:  # rank j's block ``block``, staged at block * n of its scratch
        return Src(j, Region(IN, block * count + a, block * count + a + n), block * n)

    def out(block: int) -> Region:
        return Region(OUT, block * count + a, block * count + a + n)

    if name in ("all_reduce", "reduce"):
        return (Reduce(tuple(src(j, 0) for j in range(nranks)), out(0)),)
    if name == "scan":  # the prefix: ranks 0..rank, in rank order
        return (Reduce(tuple(src(j, 0) for j in range(rank + 1)), out(0)),)
    if name == "reduce_scatter":
        return (Reduce(tuple(src(j, rank) for j in range(nranks)), out(0)),)
    if name == "broadcast":
        return (Fetch(src(root, 0), out(0)),)
    if name == "scatter":
        return (Fetch(src(root, rank), out(0)),)
    if name in ("all_gather", "gather"):
        return tuple(Fetch(src(i, 0), out(i)) for i in range(nranks))
    if name == "all_to_all":
        return tuple(Fetch(src(i, rank), out(i)) for i in range(nranks))
    raise ValueError(f"no GPU plan for {name!r}")


def divisor(name: str, rank: int, nranks: int) -> int:
    """What ``scale`` regions are divided by (avg): the ranks the result covers."""
    return rank + 1 if name == "scan" else nranks


def reads_input(name: str, rank: int, root: int) -> bool:
    return rank == root if name in ROOT_PUBLISHES else True


def writes_output(name: str, rank: int, root: int) -> bool:
    return rank == root if name in ROOT_CONSUMES else True


def stage_pieces(name: str, size: int, piece: int) -> list[tuple[int, int]]:
    """Element ranges ``[a, b)`` the staged path handles one after the other.

    Elementwise ops (all_reduce, reduce, broadcast) split into ``piece``-sized
    ranges, so piece k's host transfer overlaps piece k+1's device-to-host
    copy and piece k-1's copy back. Ops whose output mixes blocks run whole.
    """
    if name not in ("all_reduce", "reduce", "broadcast") or size <= piece:
        return [(0, size)]
    return [(a, min(a + piece, size)) for a in range(0, size, piece)]


def publish(piece: Step, inp: Any, scratch: Any, copy: Callable[[Any, Any], None]) -> None:
    """Run ``piece``'s publish phase on flat arrays (cupy on a GPU, numpy in the tests)."""
    for st in piece.stage:
        copy(scratch[st.slot:st.slot + st.src.count], inp[st.src.start:st.src.stop])


def consume(piece: Step, out: Any, scratches: Sequence[Any], copy: Callable[[Any, Any], None],
            combine: Callable[[Any, Any, Any], None], finish: Callable[[Any], None]) -> None:
    """Run ``piece``'s consume phase: ``scratches[r]`` is rank r's scratch as this rank sees it."""
    for rd in piece.reads:
        dst = out[rd.dst.start:rd.dst.stop]
        if isinstance(rd, Fetch):
            s = rd.src
            copy(dst, scratches[s.rank][s.slot:s.slot + s.region.count])
            continue
        srcs = [scratches[s.rank][s.slot:s.slot + s.region.count] for s in rd.srcs]
        if len(srcs) == 1:
            copy(dst, srcs[0])
        else:
            combine(dst, srcs[0], srcs[1])
            for s2 in srcs[2:]:
                combine(dst, dst, s2)
    for reg in piece.scale:
        finish(out[reg.start:reg.stop])
