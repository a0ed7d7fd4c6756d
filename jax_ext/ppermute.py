"""``ppermute``: each member sends to one member and receives from one, ``jax.lax.ppermute`` semantics.

Members that no pair sends to get zeros. Transpose: the inverse permutation.

Two ways, chosen per call at trace time:

- small (the whole group's data within the native core's size limit, on CPU): an ``all_gather`` of
  every member's block, and each member takes its source's block. Why: a gather is one lockstep step on
  shared memory, in C inside jitted code on any engine, where point-to-point runs in C only on a
  same-host pair with an engine of its own thread (the native lane borrows it) and costs a hand-off to
  the engine otherwise. Autodiff and vmap follow the gather and the take (the cotangent reaches the
  source through the gather's transpose).
- otherwise the group's point-to-point path under a tag of its own, so it never matches a user's
  ``send``/``recv`` (in C, through the native lane, where it can: ``native_call.py``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from aioccl import Communicator
from aioccl.engine.shm import native as shm_native

from . import _compat, in_process, native_call
from ._primitive import (
    AxisGroup,
    Group,
    check_dtype,
    check_int,
    def_batching,
    def_linear,
    define,
    group_for,
    varying_in,
)

TAG = 2**61 + 1


def _abstract(x: Any, pos: Any, *, group: Group, perm: tuple[tuple[int, int], ...]) -> Any:
    check_dtype("ppermute", x.dtype)
    return x


def _run(comm: Communicator, ins: list[np.ndarray], outs: list[np.ndarray], same: bool, *,
         perm: tuple[tuple[int, int], ...]) -> None:
    me = comm.rank
    dst = next((d for s, d in perm if s == me), None)
    src = next((s for s, d in perm if d == me), None)
    works = []
    if src is not None:
        works.append(comm.irecv(outs[0], src, TAG))
    else:
        outs[0][...] = 0
    if dst is not None:
        works.append(comm.isend(ins[0], dst, TAG))
    for w in works:
        w.wait()


def _pair(*, rank: int, perm: tuple[tuple[int, int], ...]) -> tuple[int, int, int]:
    """This member's (dest, source, TAG) for the native lane; -1: it sends or receives nothing."""
    return (next((d for s, d in perm if s == rank), -1), next((s for s, d in perm if d == rank), -1), TAG)


ppermute_p = define("ppermute", abstract=_abstract, run=_run, pair=_pair)
def_linear(ppermute_p, lambda ct, pos, *, group, perm: ppermute_p.bind(
    ct, pos, group=group, perm=tuple((d, s) for s, d in perm)))
def_batching(ppermute_p, axis0=False)


def check_perm(api: str, perm: Any, n: int) -> tuple[tuple[int, int], ...]:
    pairs = tuple((check_int(api, "perm source", s), check_int(api, "perm destination", d)) for s, d in perm)
    for s, d in pairs:
        if not (0 <= s < n and 0 <= d < n):
            raise ValueError(f"{api}: pair ({s}, {d}) out of range for {n} members")
    srcs, dsts = [s for s, _ in pairs], [d for _, d in pairs]
    if len(set(srcs)) != len(srcs) or len(set(dsts)) != len(dsts):
        raise ValueError(f"{api}: perm sends from or to one member twice: {pairs}")
    return pairs


def ppermute(x: Any, axis_name: Any = None, perm: Any = (), *, comm: Communicator | None = None) -> Any:
    """Send ``x`` along the ``(source, destination)`` pairs of ``perm`` (indices along ``axis_name``)."""
    if axis_name is not None and jax.process_count() == 1:
        pairs = check_perm("ppermute", perm, in_process.group_size("ppermute", axis_name))
        return in_process.placed("ppermute", axis_name, x, lambda v: in_process.lax("ppermute")(v, axis_name, pairs),
                                 lambda v: _ppermute(v, axis_name, perm, comm))
    return _ppermute(x, axis_name, perm, comm)


def _ppermute(x: Any, axis_name: Any, perm: Any, comm: Communicator | None) -> Any:
    if isinstance(axis_name, (tuple, list)):  # numbered as lax numbers it, which changed in jax 0.12
        axis_name = _compat.ppermute_axes(tuple(axis_name))
    group, pos = group_for("ppermute", axis_name, comm)
    pairs = check_perm("ppermute", perm, group.size)

    def one(v: Any) -> Any:
        v = varying_in(group, jnp.asarray(v))
        if _by_gather(v, group):
            return _gathered(v, pos, group, pairs)
        return ppermute_p.bind(v, pos, group=group, perm=pairs)

    return jax.tree_util.tree_map(one, x)


def _by_gather(v: Any, group: Group) -> bool:
    """Is a gather the faster way: on CPU with the native custom call, and the gathered bytes small enough
    for the native core?"""
    nbytes = int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize * group.size
    return (0 < nbytes <= shm_native.max_bytes() and jax.default_backend() == "cpu"
            and native_call.why_not() is None)


def _gathered(v: Any, pos: Any, group: Group, pairs: tuple[tuple[int, int], ...]) -> Any:
    """The permutation as a gather of every member's block, then a take of the source's (zeros for a
    member no pair sends to)."""
    from .all_gather import all_gather_p

    every = all_gather_p.bind(v[None], pos, group=group)  # (members, *v.shape)
    source = [-1] * group.size
    for s, d in pairs:
        source[d] = s
    if isinstance(group, AxisGroup):
        me = jax.lax.axis_index(group.axes)
        src = jnp.asarray(source, jnp.int32)[me]
        block = jax.lax.dynamic_index_in_dim(every, jnp.maximum(src, 0), 0, keepdims=False)
        return jnp.where(src >= 0, block, jnp.zeros_like(block))
    mine = source[group.rank]
    return every[mine] if mine >= 0 else jnp.zeros_like(v)
