"""``broadcast``: every member gets ``root``'s value (process-level, or over mesh axes).

Not differentiable here: its transpose is a reduce onto the root, which
jax.lax has no counterpart for either.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from aioccl import Communicator

from . import _compat
from ._primitive import Group, check_dtype, def_batching, define, group_for, varying_in


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


_compat.def_jvp(broadcast_p, _jvp)


def broadcast(x: Any, root: int = 0, axis_name: Any = None, *, comm: Communicator | None = None) -> Any:
    """``root``'s ``x`` on every member (forward-mode differentiable; no reverse mode)."""
    group, pos = group_for("broadcast", axis_name, comm)
    if not 0 <= int(root) < group.size:
        raise ValueError(f"broadcast: root {root} out of range for {group.size} members")
    return jax.tree_util.tree_map(
        lambda v: broadcast_p.bind(varying_in(group, jnp.asarray(v)), pos, group=group, root=int(root)), x)
