"""``reduce``: the reduction onto ``root`` (``MPI_Reduce``, mpi4jax's ``reduce``).

The root gets the reduction; the other ranks get their ``x`` back
(mpi4jax's convention). Process level only (the results differ by rank).
Linear for sum and avg: the root's cotangent is broadcast back to every
contributor, and the other ranks keep their own (their output is ``x``).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from aioccl import Communicator, ReduceOp

from . import _compat
from ._primitive import (
    CommGroup,
    as_array,
    check_reduction,
    check_root,
    def_batching,
    def_reduction_jvp,
    define,
    dense,
    parse_op,
    process_group,
)


def _abstract(x: Any, pos: Any, *, group: CommGroup, root: int, op: str) -> Any:
    check_reduction("reduce", op, x.dtype)
    return x


def _run(comm: Communicator, ins: list[np.ndarray], outs: list[np.ndarray], same: bool, *,
         root: int, op: str) -> None:
    if comm.rank == root:
        (comm.reduce(outs[0], root, op) if same else comm.reduce(ins[0], root, op, out=outs[0])).wait()
        return
    comm.reduce(ins[0], root, op).wait()
    if not same:
        outs[0][...] = ins[0]


reduce_p = define("reduce", abstract=_abstract, run=_run, alias=True)


def _transpose(ct: Any, x: Any, pos: Any, *, group: CommGroup, root: int, op: str) -> Any:
    from .broadcast import broadcast_p

    ct = dense(ct)
    back = broadcast_p.bind(ct, pos, group=group, root=root)
    back = back / group.size if op == "avg" else back
    return (back if group.rank == root else back + ct), None


def_reduction_jvp(reduce_p, "reduce")
_compat.def_transpose(reduce_p, _transpose)
def_batching(reduce_p, axis0=False)


def reduce(x: Any, op: str | ReduceOp = "sum", root: int = 0, *, comm: Communicator | None = None) -> Any:
    """On ``root``, the reduction of every rank's ``x``; elsewhere ``x`` itself."""
    group, pos = process_group("reduce", comm)
    root = check_root("reduce", root, group.size)
    op = parse_op(op)
    return jax.tree_util.tree_map(lambda v: reduce_p.bind(as_array(v), pos, group=group, root=root, op=op), x)
