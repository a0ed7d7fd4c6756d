"""``recv``: receive an array shaped like ``like`` from member ``source``.

``like`` is an operand (its values are ignored): that is what lets JAX's
forward mode reach the receiver, whose tangent then arrives from the sender
right after the value. Reverse mode raises (see ``send``).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from aioccl import Communicator

from . import _compat
from ._primitive import AxisGroup, Group, check_dtype, def_batching, define, group_for
from .send import REVERSE_MODE, check_peer, check_tag


def _abstract(like: Any, pos: Any, *, group: Group, source: int, tag: int) -> Any:
    check_dtype("recv", like.dtype)
    return _compat.with_varying(like, _compat.varying(pos)) if isinstance(group, AxisGroup) else like


def _run(comm: Communicator, ins: list[np.ndarray], outs: list[np.ndarray], same: bool, *,
         source: int, tag: int) -> None:
    comm.irecv(outs[0], source, tag).wait()


recv_p = define("recv", abstract=_abstract, run=_run)
def_batching(recv_p, axis0=False)


def _jvp(primals: Any, tangents: Any, **params: Any) -> Any:
    like, pos = primals
    return recv_p.bind(like, pos, **params), recv_p.bind(like, pos, **params)


def _no_reverse(*args: Any, **params: Any) -> Any:
    raise NotImplementedError(REVERSE_MODE.format(api="recv"))


_compat.def_jvp(recv_p, _jvp)
_compat.def_linearize(recv_p, _no_reverse)


def recv(like: Any, source: int, tag: int = 0, *, axis_name: Any = None, comm: Communicator | None = None) -> Any:
    """Receive from ``source`` an array shaped like ``like`` (an array, or a ``jax.ShapeDtypeStruct``)."""
    group, pos = group_for("recv", axis_name, comm)
    template = like if hasattr(like, "__jax_array__") or isinstance(like, jnp.ndarray) else None
    if template is None:
        template = jnp.zeros(like.shape, like.dtype)
    return recv_p.bind(template, pos, group=group, source=check_peer("recv", source, group.size),
                       tag=check_tag("recv", tag))
