"""``gather``: every process's ``x`` onto ``root``, stacked (``MPI_Gather``, mpi4jax's ``gather``).

The root gets shape ``(n, *x.shape)``; the other ranks get their ``x`` back
(mpi4jax's convention: under ``jit`` each process traces its own program, so
the shapes may differ by rank). Process level only: a mesh has one program
for every device. Linear; the transpose scatters the root's cotangent back.
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
    check_dtype("gather", x.dtype)
    return x.update(shape=(group.size, *x.shape)) if group.rank == root else x


def _run(comm: Communicator, ins: list[np.ndarray], outs: list[np.ndarray], same: bool, *, root: int) -> None:
    if comm.rank == root:
        comm.gather(ins[0].reshape(-1), root, out=outs[0].reshape(-1)).wait()
        return
    comm.gather(ins[0].reshape(-1), root).wait()
    if not same:
        outs[0][...] = ins[0]


gather_p = define("gather", abstract=_abstract, run=_run, alias=lambda *, group, root: group.rank != root)


def _transpose(ct: Any, pos: Any, *, group: CommGroup, root: int) -> Any:
    from .scatter import scatter_p

    mine = scatter_p.bind(ct, pos, group=group, root=root)  # elsewhere ct is the template of my block
    return mine if group.rank == root else mine + ct


def _batch(args: Any, dims: Any, *, group: CommGroup, root: int) -> Any:
    (x, pos), (d, _) = args, dims
    x = jnp.moveaxis(x, d, 0) if d is not None else x
    out_dim = None if d is None else (1 if group.rank == root else 0)
    return gather_p.bind(x, pos, group=group, root=root), out_dim


def_linear(gather_p, _transpose)
_compat.def_batching(gather_p, _batch)


def gather(x: Any, root: int = 0, *, comm: Communicator | None = None) -> Any:
    """On ``root``, every rank's ``x`` stacked along a new axis 0; elsewhere ``x`` itself."""
    group, pos = process_group("gather", comm)
    root = check_root("gather", root, group.size)
    return jax.tree_util.tree_map(lambda v: gather_p.bind(as_array(v), pos, group=group, root=root), x)
