"""``broadcast``: every member gets ``root``'s value (process-level, or over mesh axes).

Linear. Process level, its transpose is a sum onto the root (``reduce``):
every rank's output came from the root's input, and the others' inputs are
ignored (zero cotangent). Mesh level it has no reverse mode (jax.lax has no
broadcast to follow); forward mode works at both levels.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from aioccl import Communicator

from . import _compat, in_process
from ._primitive import (
    CommGroup,
    Group,
    as_array,
    check_dtype,
    check_root,
    def_batching,
    define,
    dense,
    group_for,
    varying_in,
)


def _abstract(x: Any, pos: Any, *, group: Group, root: int) -> Any:
    check_dtype("broadcast", x.dtype)
    return x


def _run(comm: Communicator, ins: list[np.ndarray], outs: list[np.ndarray], same: bool, *, root: int) -> None:
    if same:
        comm.broadcast(outs[0], root).wait()
    else:
        comm.broadcast(ins[0], root, out=outs[0]).wait()


broadcast_p = define("broadcast", abstract=_abstract, run=_run, alias=True)
def_batching(broadcast_p, axis0=False)


def _jvp(primals: Any, tangents: Any, *, group: Group, root: int) -> Any:
    x, pos = primals
    return (broadcast_p.bind(x, pos, group=group, root=root),
            broadcast_p.bind(_compat.instantiate_zeros(tangents[0]), pos, group=group, root=root))


def _transpose(ct: Any, x: Any, pos: Any, *, group: Group, root: int) -> Any:
    from .reduce import reduce_p

    if not isinstance(group, CommGroup):
        raise NotImplementedError("jax_ext: a mesh-level broadcast has no reverse mode; use psum of the value "
                                  "masked to the root (jnp.where(lax.axis_index(...) == root, x, 0)), which has")
    total = reduce_p.bind(dense(ct), pos, group=group, root=root, op="sum")  # every rank joins; root gets the sum
    return (total if group.rank == root else jnp.zeros_like(total)), None


_compat.def_jvp(broadcast_p, _jvp)
_compat.def_transpose(broadcast_p, _transpose)


def broadcast(x: Any, root: int = 0, axis_name: Any = None, *, comm: Communicator | None = None) -> Any:
    """``root``'s ``x`` on every member (differentiable; mesh level: forward mode only)."""
    if axis_name is not None:
        check_root("broadcast", root, in_process.group_size("broadcast", axis_name))
    # XLA's: root's block of lax's gather, exact for every value (-0.0 and NaN payloads too, which a psum of a
    # masked value is not); lax.pbroadcast has no CPU lowering in the jax releases jax_ext supports
    return in_process.placed(
        "broadcast", axis_name, x,
        lambda v: jax.tree_util.tree_map(lambda w: in_process.lax("all_gather")(as_array(w), axis_name)[root], v),
        lambda v: _broadcast(v, root, axis_name, comm))


def _broadcast(x: Any, root: int, axis_name: Any, comm: Communicator | None) -> Any:
    group, pos = group_for("broadcast", axis_name, comm)
    root = check_root("broadcast", root, group.size)
    return jax.tree_util.tree_map(
        lambda v: broadcast_p.bind(varying_in(group, as_array(v)), pos, group=group, root=root), x)
