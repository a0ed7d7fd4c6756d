"""``all_gather``: process-level (``comm=``) or over mesh axes (``axis_name=``), ``jax.lax`` semantics.

The primitive concatenates along axis 0 (aioccl's layout); ``axis`` and
``tiled`` are moves and reshapes in JAX around it. Transpose: the sum
``reduce_scatter`` (as ``lax.all_gather``'s is ``lax.psum_scatter``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from aioccl import Communicator

from . import in_process
from ._primitive import Group, check_dtype, def_batching, def_linear, define, group_for, varying_in


def _abstract(x: Any, pos: Any, *, group: Group) -> Any:
    check_dtype("all_gather", x.dtype)
    return x.update(shape=(group.size * x.shape[0], *x.shape[1:]))


def _run(comm: Communicator, ins: list[np.ndarray], outs: list[np.ndarray], same: bool) -> None:
    comm.all_gather(ins[0], out=outs[0]).wait()


all_gather_p = define("all_gather", abstract=_abstract, run=_run)


def _transpose(ct: Any, pos: Any, *, group: Group) -> Any:
    from .reduce_scatter import reduce_scatter_p

    return reduce_scatter_p.bind(ct, pos, group=group, op="sum")


def_linear(all_gather_p, _transpose)
def_batching(all_gather_p, axis0=True)


def all_gather(x: Any, axis_name: Any = None, *, axis: int = 0, tiled: bool = False,
               comm: Communicator | None = None) -> Any:
    """Gather ``x`` from every member: a new axis ``axis`` of size n, or (``tiled``) concatenated along it.

    With ``axis_name`` (inside ``shard_map``) the members are the devices along those mesh axes, as
    ``jax.lax.all_gather``; without it, the processes of ``comm``
    (default [`default_comm()`][jax_ext.runtime.default_comm]).
    """
    return in_process.placed("all_gather", axis_name, x,
                             lambda v: in_process.lax("all_gather")(v, axis_name, axis=axis, tiled=tiled),
                             lambda v: _all_gather(v, axis_name, axis, tiled, comm))


def _all_gather(x: Any, axis_name: Any, axis: int, tiled: bool, comm: Communicator | None) -> Any:
    group, pos = group_for("all_gather", axis_name, comm)

    def one(v: Any) -> Any:
        v = varying_in(group, jnp.asarray(v))
        if tiled:
            if v.ndim == 0:
                raise ValueError("all_gather: tiled=True needs an array with at least one axis")
            ax = axis % v.ndim
        else:
            ax = axis % (v.ndim + 1)
            v = jnp.expand_dims(v, ax)
        out = all_gather_p.bind(jnp.moveaxis(v, ax, 0), pos, group=group)
        return jnp.moveaxis(out, 0, ax)

    return jax.tree_util.tree_map(one, x)
