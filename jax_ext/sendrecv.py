"""``sendrecv``: send ``x`` to ``dest`` and receive from ``source`` in one op (as MPI_Sendrecv).

Unlike separate ``send``/``recv`` it is linear with an input and an output
on every rank, so it transposes: the cotangent travels back, from the
receiver to the sender (``sendrecv(ct, source=dest, dest=source)``). Its
static ``shape`` is the received array's, so ``vmap`` has a rule of its own
that adds the batch axis to it (the generic rule would receive one example).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from aioccl import Communicator

from . import _compat
from ._primitive import Group, as_array, check_dtype, define, dense, group_for, varying_in
from .recv import Status, check_status, fill, template
from .send import check_peer, check_tag


def _abstract(x: Any, pos: Any, *, group: Group, source: int, dest: int, tag: int,
              shape: tuple[int, ...], dtype: Any, status: Status | None) -> Any:
    check_dtype("sendrecv", x.dtype)
    check_dtype("sendrecv", dtype)
    return x.update(shape=shape, dtype=dtype)


def _run(comm: Communicator, ins: list[np.ndarray], outs: list[np.ndarray], same: bool, *,
         source: int, dest: int, tag: int, shape: tuple[int, ...], dtype: Any, status: Status | None) -> None:
    r = comm.irecv(outs[0], source, tag)
    comm.isend(ins[0], dest, tag).wait()
    r.wait()
    fill(status, source, tag, outs[0])


sendrecv_p = define("sendrecv", abstract=_abstract, run=_run,  # (a Status to fill: the engine's)
                    pair=lambda *, rank, source, dest, tag, status, **_: None if status else (dest, source, tag))


def _batch(args: Any, dims: Any, **params: Any) -> Any:
    (x, pos), (d, pdim) = args, dims
    if pdim is not None:
        raise ValueError("sendrecv: cannot vmap over the mesh position (vmap inside shard_map instead)")
    if d is None:
        return sendrecv_p.bind(x, pos, **params), None
    x = jnp.moveaxis(x, d, 0)
    return sendrecv_p.bind(x, pos, **{**params, "shape": (x.shape[0], *params["shape"])}), 0


def _jvp(primals: Any, tangents: Any, **params: Any) -> Any:
    x, pos = primals
    return (sendrecv_p.bind(x, pos, **params),
            sendrecv_p.bind(_compat.instantiate_zeros(tangents[0]), pos, **{**params, "status": None}))


def _transpose(ct: Any, x: Any, pos: Any, *, group: Group, source: int, dest: int, tag: int,
               shape: tuple[int, ...], dtype: Any, status: Status | None) -> Any:
    back = sendrecv_p.bind(dense(ct), pos, group=group, source=dest, dest=source, tag=tag,
                           shape=tuple(x.aval.shape), dtype=x.aval.dtype, status=None)
    return back, None


_compat.def_batching(sendrecv_p, _batch)
_compat.def_jvp(sendrecv_p, _jvp)
_compat.def_transpose(sendrecv_p, _transpose)


def sendrecv(x: Any, source: int, dest: int, tag: int = 0, *, like: Any = None, axis_name: Any = None,
             comm: Communicator | None = None, status: Status | None = None) -> Any:
    """Send ``x`` to ``dest``; return what ``source`` sent (shaped like ``like``, default like ``x``;
    arrays, Python scalars and ``jax.ShapeDtypeStruct`` alike)."""
    group, pos = group_for("sendrecv", axis_name, comm)
    x = varying_in(group, as_array(x))
    shaped = x if like is None else like if hasattr(like, "shape") and hasattr(like, "dtype") else template(like)
    return sendrecv_p.bind(x, pos, group=group, source=check_peer("sendrecv", source, group.size, "source"),
                           dest=check_peer("sendrecv", dest, group.size, "dest"), tag=check_tag("sendrecv", tag),
                           shape=tuple(shaped.shape), dtype=jnp.dtype(shaped.dtype),
                           status=check_status("sendrecv", status, group))
