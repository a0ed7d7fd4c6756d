"""``sendrecv``: send ``x`` to ``dest`` and receive from ``source`` in one op (as MPI_Sendrecv).

Unlike separate ``send``/``recv`` it is linear with an input and an output
on every rank, so it transposes: the cotangent travels back, from the
receiver to the sender (``sendrecv(ct, source=dest, dest=source)``).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from aioccl import Communicator

from . import _compat
from ._primitive import Group, check_dtype, def_batching, define, dense, group_for, varying_in
from .send import check_peer, check_tag


def _abstract(x: Any, pos: Any, *, group: Group, source: int, dest: int, tag: int,
              shape: tuple[int, ...], dtype: Any) -> Any:
    check_dtype("sendrecv", x.dtype)
    check_dtype("sendrecv", dtype)
    return x.update(shape=shape, dtype=dtype)


def _run(comm: Communicator, ins: list[np.ndarray], outs: list[np.ndarray], same: bool, *,
         source: int, dest: int, tag: int, shape: tuple[int, ...], dtype: Any) -> None:
    r = comm.irecv(outs[0], source, tag)
    comm.isend(ins[0], dest, tag).wait()
    r.wait()


sendrecv_p = define("sendrecv", abstract=_abstract, run=_run)
def_batching(sendrecv_p, axis0=False)


def _jvp(primals: Any, tangents: Any, **params: Any) -> Any:
    x, pos = primals
    return (sendrecv_p.bind(x, pos, **params),
            sendrecv_p.bind(_compat.instantiate_zeros(tangents[0]), pos, **params))


def _transpose(ct: Any, x: Any, pos: Any, *, group: Group, source: int, dest: int, tag: int,
               shape: tuple[int, ...], dtype: Any) -> Any:
    back = sendrecv_p.bind(dense(ct), pos, group=group, source=dest, dest=source, tag=tag,
                           shape=tuple(x.aval.shape), dtype=x.aval.dtype)
    return back, None


_compat.def_jvp(sendrecv_p, _jvp)
_compat.def_transpose(sendrecv_p, _transpose)


def sendrecv(x: Any, source: int, dest: int, tag: int = 0, *, like: Any = None, axis_name: Any = None,
             comm: Communicator | None = None) -> Any:
    """Send ``x`` to ``dest``; return what ``source`` sent (shaped like ``like``, default like ``x``)."""
    group, pos = group_for("sendrecv", axis_name, comm)
    x = varying_in(group, jnp.asarray(x))
    like = x if like is None else like
    return sendrecv_p.bind(x, pos, group=group, source=check_peer("sendrecv", source, group.size),
                           dest=check_peer("sendrecv", dest, group.size), tag=check_tag("sendrecv", tag),
                           shape=tuple(like.shape), dtype=jnp.dtype(like.dtype))
