"""``scan``: the inclusive prefix reduction over the processes (``MPI_Scan``, mpi4jax's ``scan``).

Rank r gets ``x_0 op ... op x_r`` (aioccl's ``Communicator.scan``: folded
in rank order; ``avg`` divides by r + 1). Process level only. Linear for sum
and avg: rank j's input reaches the outputs of ranks j..n-1, so its
cotangent is the suffix sum of theirs, folded here from an all_gather.
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
    def_batching,
    def_reduction_jvp,
    define,
    dense,
    parse_op,
    process_group,
)


def _abstract(x: Any, pos: Any, *, group: CommGroup, op: str) -> Any:
    check_reduction("scan", op, x.dtype)
    return x


def _run(comm: Communicator, ins: list[np.ndarray], outs: list[np.ndarray], same: bool, *, op: str) -> None:
    (comm.scan(outs[0], op) if same else comm.scan(ins[0], op, out=outs[0])).wait()


scan_p = define("scan", abstract=_abstract, run=_run, alias=True)


def _transpose(ct: Any, x: Any, pos: Any, *, group: CommGroup, op: str) -> Any:
    from .all_gather import all_gather_p

    ct = dense(ct)
    every = all_gather_p.bind(ct[None], pos, group=group)  # row r: rank r's cotangent
    rows = [every[r] / (r + 1) if op == "avg" else every[r] for r in range(group.rank, group.size)]
    acc = rows[0]
    for row in rows[1:]:
        acc = acc + row
    return acc, None


def_reduction_jvp(scan_p, "scan")
_compat.def_transpose(scan_p, _transpose)
def_batching(scan_p, axis0=False)


def scan(x: Any, op: str | ReduceOp = "sum", *, comm: Communicator | None = None) -> Any:
    """Rank r gets the reduction of the ``x`` of ranks 0..r (``avg``: divided by r + 1)."""
    group, pos = process_group("scan", comm)
    op = parse_op(op)
    return jax.tree_util.tree_map(lambda v: scan_p.bind(as_array(v), pos, group=group, op=op), x)
