"""``scatter``: block i of the root's ``x`` to rank i (``MPI_Scatter``, mpi4jax's ``scatter``).

The root passes shape ``(n, *s)``; the other ranks pass an array of shape
``s`` (a template: its values are ignored), and every rank gets shape ``s``.
Process level only. Linear; the transpose gathers the cotangents onto the
root (the templates get zero).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from aioccl import Communicator

from . import _compat
from ._primitive import CommGroup, as_array, check_dtype, check_root, def_linear, define, process_group


def _abstract(x: Any, pos: Any, *, group: CommGroup, root: int) -> Any:
    check_dtype("scatter", x.dtype)
    if group.rank != root:
        return x
    if x.ndim == 0 or x.shape[0] != group.size:
        raise ValueError(f"scatter: the root's input must have shape (nproc, ...) = ({group.size}, ...), "
                         f"got {tuple(x.shape)}")
    return x.update(shape=x.shape[1:])


def _run(comm: Communicator, ins: list[np.ndarray], outs: list[np.ndarray], same: bool, *, root: int) -> None:
    src = ins[0].reshape(-1) if comm.rank == root else None
    comm.scatter(src, root, out=outs[0].reshape(-1)).wait()


scatter_p = define("scatter", abstract=_abstract, run=_run)


def _transpose(ct: Any, pos: Any, *, group: CommGroup, root: int) -> Any:
    from .gather import gather_p

    back = gather_p.bind(ct, pos, group=group, root=root)
    return back if group.rank == root else jnp.zeros_like(ct)


def _batch(args: Any, dims: Any, *, group: CommGroup, root: int) -> Any:
    (x, pos), (d, _) = args, dims
    if d is None:
        return scatter_p.bind(x, pos, group=group, root=root), None
    x = jnp.moveaxis(x, d, 1 if group.rank == root else 0)  # the root's axis 0 is the ranks'
    return scatter_p.bind(x, pos, group=group, root=root), 0


def_linear(scatter_p, _transpose)
_compat.def_batching(scatter_p, _batch)


def scatter(x: Any, root: int = 0, *, comm: Communicator | None = None) -> Any:
    """Rank i gets ``x[i]`` of the root's ``x`` (shape ``(n, *s)``); other ranks pass an ``s``-shaped template."""
    group, pos = process_group("scatter", comm)
    root = check_root("scatter", root, group.size)
    return jax.tree_util.tree_map(lambda v: scatter_p.bind(as_array(v), pos, group=group, root=root), x)
