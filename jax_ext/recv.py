"""``recv``: receive an array of a known shape and dtype from member ``source``.

Forward-mode differentiable; reverse mode raises (see ``send``).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from aioccl import Communicator

from . import _compat
from ._primitive import AxisGroup, Group, check_dtype, define, group_for
from .send import REVERSE_MODE, check_peer, check_tag


def _abstract(pos: Any, *, group: Group, source: int, tag: int, shape: tuple[int, ...], dtype: Any) -> Any:
    check_dtype("recv", dtype)
    aval = _compat.ShapedArray(shape, dtype)
    return _compat.with_varying(aval, _compat.varying(pos)) if isinstance(group, AxisGroup) else aval


def _run(comm: Communicator, ins: list[np.ndarray], outs: list[np.ndarray], same: bool, *,
         source: int, tag: int, shape: tuple[int, ...], dtype: Any) -> None:
    comm.irecv(outs[0], source, tag).wait()


recv_p = define("recv", abstract=_abstract, run=_run)


def _jvp(primals: Any, tangents: Any, **params: Any) -> Any:
    (pos,) = primals
    return recv_p.bind(pos, **params), recv_p.bind(pos, **params)


def _no_reverse(*args: Any, **params: Any) -> Any:
    raise NotImplementedError(REVERSE_MODE.format(api="recv"))


_compat.def_jvp(recv_p, _jvp)
_compat.def_linearize(recv_p, _no_reverse)


def recv(like: Any, source: int, tag: int = 0, *, axis_name: Any = None, comm: Communicator | None = None) -> Any:
    """Receive from ``source`` an array shaped like ``like`` (an array or ``jax.ShapeDtypeStruct``)."""
    group, pos = group_for("recv", axis_name, comm)
    return recv_p.bind(pos, group=group, source=check_peer("recv", source, group.size), tag=check_tag("recv", tag),
                       shape=tuple(like.shape), dtype=jnp.dtype(like.dtype))
