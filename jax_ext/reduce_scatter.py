"""``reduce_scatter`` (process-level) and ``psum_scatter`` (mesh axes), ``jax.lax`` semantics.

The primitive reduces n blocks along axis 0 and keeps block ``rank``.
Transpose (sum): ``all_gather``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from aioccl import Communicator, ReduceOp

from . import _compat, in_process
from ._primitive import Group, check_reduction, def_batching, def_reduction_jvp, define, dense, group_for, varying_in


def _abstract(x: Any, pos: Any, *, group: Group, op: str) -> Any:
    check_reduction("reduce_scatter", op, x.dtype)
    if x.shape[0] % group.size:
        raise ValueError(f"reduce_scatter: the scattered axis has size {x.shape[0]}, not a multiple of the "
                         f"{group.size} members")
    return x.update(shape=(x.shape[0] // group.size, *x.shape[1:]))


def _run(comm: Communicator, ins: list[np.ndarray], outs: list[np.ndarray], same: bool, *, op: str) -> None:
    comm.reduce_scatter(ins[0], op, out=outs[0]).wait()


reduce_scatter_p = define("reduce_scatter", abstract=_abstract, run=_run)


def _transpose(ct: Any, x: Any, pos: Any, *, group: Group, op: str) -> Any:
    from .all_gather import all_gather_p

    out = all_gather_p.bind(dense(ct), pos, group=group)
    return (out / group.size if op == "avg" else out), None


def_reduction_jvp(reduce_scatter_p, "reduce_scatter")
_compat.def_transpose(reduce_scatter_p, _transpose)
def_batching(reduce_scatter_p, axis0=True)


def _scatter(api: str, x: Any, op: str | ReduceOp, axis_name: Any, comm: Communicator | None, dim: int,
             tiled: bool) -> Any:
    op = ReduceOp.parse(op).value
    if op != "sum":
        return _ours(api, x, op, axis_name, comm, dim, tiled)
    return in_process.placed(
        api, axis_name, x, lambda v: in_process.lax("psum_scatter")(v, axis_name, scatter_dimension=dim, tiled=tiled),
        lambda v: _ours(api, v, op, axis_name, comm, dim, tiled), lambda d: check_reduction(api, op, d))


def _ours(api: str, x: Any, op: str, axis_name: Any, comm: Communicator | None, dim: int, tiled: bool) -> Any:
    group, pos = group_for(api, axis_name, comm)

    def one(v: Any) -> Any:
        v = varying_in(group, jnp.asarray(v))
        if v.ndim == 0:
            raise ValueError(f"{api}: needs an array with at least one axis")
        d = dim % v.ndim
        if not tiled and v.shape[d] != group.size:
            raise ValueError(f"{api}: with tiled=False, axis {d} must have the group size {group.size}, "
                             f"got shape {v.shape}")
        out = reduce_scatter_p.bind(jnp.moveaxis(v, d, 0), pos, group=group, op=op)
        return out[0] if not tiled else jnp.moveaxis(out, 0, d)

    return jax.tree_util.tree_map(one, x)


def psum_scatter(x: Any, axis_name: Any, *, scatter_dimension: int = 0, tiled: bool = False) -> Any:
    """``jax.lax.psum_scatter`` over mesh axes (inside ``shard_map``), run by aioccl."""
    return _scatter("psum_scatter", x, "sum", axis_name, None, scatter_dimension, tiled)


def reduce_scatter(x: Any, op: str | ReduceOp = "sum", *, scatter_dimension: int = 0, tiled: bool = False,
                   comm: Communicator | None = None) -> Any:
    """Reduce across the processes of ``comm`` and keep this rank's part (``psum_scatter`` keywords)."""
    return _scatter("reduce_scatter", x, op, None, comm, scatter_dimension, tiled)
