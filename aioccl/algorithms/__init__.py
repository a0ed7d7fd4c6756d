"""Sans-io collective algorithms: each returns one rank's ``Schedule``.

``plan()`` is the single entry point the engine uses; it is a pure,
cached function of (collective, size, rank, nranks, root, chunk, algorithm).
"""

from __future__ import annotations

from functools import lru_cache

from . import direct, doubling, hierarchy, prefix, ring, tree
from .schedule import Schedule
from .table import TABLE

COLLECTIVES = tuple(c.name for c in TABLE)
ALGORITHMS = {c.name: c.socket for c in TABLE}  # the socket algorithms of each collective


@lru_cache(maxsize=4096)
def plan(coll: str, count: int, rank: int, n: int, root: int, chunk: int, algo: str,
         in_place: bool = False, layout: tuple[int, ...] = ()) -> Schedule:
    """One rank's schedule. ``count`` is the whole buffer for all_reduce, reduce and
    broadcast, and the per-rank block for the block-wise collectives. ``layout`` (the host
    index of each rank) is what the hierarchical algorithms (``rail``, ``leader``) need."""
    if algo in ("rail", "leader"):
        return hierarchy.plan(coll, count, rank, layout, root, chunk, algo)
    if coll == "all_reduce":
        return doubling.all_reduce(count, rank, n) if algo == "rd" else ring.all_reduce(count, rank, n, chunk)
    if coll == "reduce":
        return tree.reduce(count, rank, n, root) if algo == "tree" else ring.reduce(count, rank, n, root, chunk)
    if coll == "broadcast":
        if algo == "tree":
            return tree.broadcast(count, rank, n, root)
        return tree.broadcast_chain(count, rank, n, root, chunk)
    if coll == "all_gather":
        return ring.all_gather(count, rank, n)
    if coll == "reduce_scatter":
        return ring.reduce_scatter(count, rank, n, chunk)
    if coll == "gather":
        return direct.gather(count, rank, n, root)
    if coll == "scatter":
        return direct.scatter(count, rank, n, root)
    if coll == "all_to_all":
        return direct.all_to_all(count, rank, n, in_place)
    if coll == "barrier":
        return direct.barrier(rank, n)
    if coll == "scan":
        return prefix.scan(count, rank, n)
    raise ValueError(f"unknown collective {coll!r}")


__all__ = ["ALGORITHMS", "COLLECTIVES", "Schedule", "plan"]
