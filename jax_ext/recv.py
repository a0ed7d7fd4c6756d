"""``recv``: receive an array shaped like ``like`` from member ``source``.

``like`` is an operand (its values are ignored): that is what lets JAX's
forward mode reach the receiver, whose tangent then arrives from the sender
right after the value. Reverse mode raises (see ``send``). ``status=``
(a ``Status``) is filled when the receive runs, as mpi4jax's is. As in
mpi4jax, ``source`` and ``tag`` default to ``ANY_SOURCE`` and ``ANY_TAG``
(process-level receives: the message's sender and tag are in ``status``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from aioccl import ANY_SOURCE, ANY_TAG, Communicator

from . import _compat
from ._primitive import AxisGroup, Group, as_array, check_dtype, def_batching, define, group_for
from .send import REVERSE_MODE, check_peer, check_tag


class Status:
    """What a receive got, filled when it runs (like ``MPI_Status``): ``source``, ``tag``, ``count``
    (elements) and ``nbytes``; -1 / 0 until then. Pass one to ``recv`` or ``sendrecv`` as ``status=``.

    Under ``jax.jit`` the object is part of the compiled function (as in mpi4jax): each call of it
    fills the same object, so read it after the result is ready (``block_until_ready``)."""

    __slots__ = ("count", "nbytes", "source", "tag")

    def __init__(self) -> None:
        self.source, self.tag, self.count, self.nbytes = -1, -1, 0, 0

    def __repr__(self) -> str:
        return f"Status(source={self.source}, tag={self.tag}, count={self.count}, nbytes={self.nbytes})"


def fill(status: Status | None, source: int, tag: int, out: Any) -> None:
    if status is not None:
        status.source, status.tag = source, tag
        status.count, status.nbytes = int(np.prod(out.shape)), int(np.prod(out.shape)) * out.dtype.itemsize


def check_status(api: str, status: Any, group: Group) -> Status | None:
    if status is None:
        return None
    if not isinstance(status, Status):
        raise TypeError(f"{api}: status must be a jax_ext.Status, got {type(status).__name__}")
    if isinstance(group, AxisGroup):
        raise ValueError(f"{api}: status= is for process-level receives (every device of a mesh-level one "
                         "would write the same object)")
    return status


def _abstract(like: Any, pos: Any, *, group: Group, source: int, tag: int, status: Status | None) -> Any:
    check_dtype("recv", like.dtype)
    return _compat.with_varying(like, _compat.varying(pos)) if isinstance(group, AxisGroup) else like


def _run(comm: Communicator, ins: list[np.ndarray], outs: list[np.ndarray], same: bool, *,
         source: int, tag: int, status: Status | None) -> None:
    w = comm.irecv(outs[0], source, tag)
    w.wait()
    fill(status, w.status.source, w.status.tag, outs[0])


recv_p = define("recv", abstract=_abstract, run=_run,  # (wildcards and a Status to fill: the engine's)
                pair=lambda *, rank, source, tag, status: (-1, source, tag) if status is None and source >= 0
                and tag >= 0 else None)
def_batching(recv_p, axis0=False)


def _jvp(primals: Any, tangents: Any, **params: Any) -> Any:
    like, pos = primals
    return recv_p.bind(like, pos, **params), recv_p.bind(like, pos, **{**params, "status": None})


def _no_reverse(*args: Any, **params: Any) -> Any:
    raise NotImplementedError(REVERSE_MODE.format(api="recv"))


_compat.def_jvp(recv_p, _jvp)
_compat.def_linearize(recv_p, _no_reverse)


def template(like: Any) -> Any:
    """An operand shaped like ``like``: an array, a Python or numpy scalar, or a ``jax.ShapeDtypeStruct``."""
    if isinstance(like, jax.ShapeDtypeStruct):
        return jnp.zeros(like.shape, like.dtype)
    return as_array(like)


def recv(like: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG, *, axis_name: Any = None,
         comm: Communicator | None = None, status: Status | None = None) -> Any:
    """Receive from ``source`` an array shaped like ``like`` (an array, a scalar, or a ``jax.ShapeDtypeStruct``);
    from any member, and with any tag, unless given (process-level only: ``status`` says whose it was)."""
    group, pos = group_for("recv", axis_name, comm)
    wild = source == ANY_SOURCE or tag == ANY_TAG
    if wild and isinstance(group, AxisGroup):
        raise ValueError("recv: ANY_SOURCE and ANY_TAG are for process-level receives; along axis_name give "
                         "source= and tag=")
    source = source if source == ANY_SOURCE else check_peer("recv", source, group.size, "source")
    tag = tag if tag == ANY_TAG else check_tag("recv", tag)
    return recv_p.bind(template(like), pos, group=group, source=source, tag=tag,
                       status=check_status("recv", status, group))
