"""What each rank copies and reduces in a GPU collective: pure functions, no GPU, no I/O.

Same-host ranks share their *scratch* buffers through CUDA IPC. An op runs
in pieces that fit the scratch; each piece is two phases with a barrier
after each:

1. **publish**: every rank that has input copies its part of the piece into
   its own scratch (``(input offset, scratch offset, count)`` triples);
2. **consume**: every rank that gets output builds its part of the piece
   from the peers' scratch: ``Copy`` one peer's span, or
   ``Reduce`` the same span of every rank's scratch, in rank order (so
   all ranks compute bit-identical results).

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
from dataclasses import dataclass
from typing import Any

from ..algorithms.table import TABLE

BLOCKED = tuple(c.name for c in TABLE if c.input_blocks)  # rank j's part is block j of the input
ROOT_PUBLISHES = tuple(c.name for c in TABLE if c.root_input_only)  # only the root has input
ROOT_CONSUMES = tuple(c.name for c in TABLE if c.root_output_only)  # only the root gets output


@dataclass(frozen=True, slots=True)
class Copy:
    """``out[dst:dst+n] = scratch[src][off:off+n]``."""

    src: int
    off: int
    dst: int
    n: int


@dataclass(frozen=True, slots=True)
class Reduce:
    """``out[dst:dst+n] = op(scratch[0][off:off+n], scratch[1][...], ...)``, in rank order."""

    nsrc: int
    off: int
    dst: int
    n: int


@dataclass(frozen=True, slots=True)
class Piece:
    publish: tuple[tuple[int, int, int], ...]  # (input offset, scratch offset, count)
    consume: tuple[Copy | Reduce, ...]


def ipc_pieces(name: str, rank: int, nranks: int, root: int, count: int, cap: int) -> list[Piece]:
    """The pieces of op ``name`` for ``rank``; ``count`` is the per-block count (as in the CPU schedules),
    ``cap`` the scratch size in elements."""
    nblk = nranks if name in BLOCKED else 1
    step = max(1, cap // nblk)
    if cap < nblk:
        raise ValueError(f"scratch of {cap} elements cannot hold {nblk} blocks")
    publishes = rank == root if name in ROOT_PUBLISHES else True
    consumes = rank == root if name in ROOT_CONSUMES else True
    pieces = []
    for a in range(0, count, step):
        n = min(step, count - a)
        pub = tuple((j * count + a, j * n, n) for j in range(nblk)) if publishes else ()
        pieces.append(Piece(pub, _consume(name, rank, nranks, root, count, a, n) if consumes else ()))
    return pieces


def _consume(name: str, rank: int, nranks: int, root: int, count: int, a: int, n: int) -> tuple[Copy | Reduce, ...]:
    if name in ("all_reduce", "reduce"):
        return (Reduce(nranks, 0, a, n),)
    if name == "reduce_scatter":
        return (Reduce(nranks, rank * n, a, n),)
    if name == "broadcast":
        return (Copy(root, 0, a, n),)
    if name == "scatter":
        return (Copy(root, rank * n, a, n),)
    if name in ("all_gather", "gather"):
        return tuple(Copy(i, 0, i * count + a, n) for i in range(nranks))
    if name == "all_to_all":
        return tuple(Copy(i, rank * n, i * count + a, n) for i in range(nranks))
    raise ValueError(f"no GPU plan for {name!r}")


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


def publish(piece: Piece, inp: Any, scratch: Any, copy: Callable[[Any, Any], None]) -> None:
    """Run ``piece``'s publish phase on flat arrays (cupy on a GPU, numpy in the tests)."""
    for i, s, n in piece.publish:
        copy(scratch[s:s + n], inp[i:i + n])


def consume(piece: Piece, out: Any, scratches: Sequence[Any], copy: Callable[[Any, Any], None],
            combine: Callable[[Any, Any, Any], None], finish: Callable[[Any], None]) -> None:
    """Run ``piece``'s consume phase: ``scratches[r]`` is rank r's scratch as this rank sees it."""
    for step in piece.consume:
        dst = out[step.dst:step.dst + step.n]
        if isinstance(step, Copy):
            copy(dst, scratches[step.src][step.off:step.off + step.n])
            continue
        srcs = [scratches[r][step.off:step.off + step.n] for r in range(step.nsrc)]
        if len(srcs) == 1:
            copy(dst, srcs[0])
        else:
            combine(dst, srcs[0], srcs[1])
            for s in srcs[2:]:
                combine(dst, dst, s)
        finish(dst)
