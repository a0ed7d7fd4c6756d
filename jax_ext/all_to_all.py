"""``all_to_all``: process-level (``comm=``) or over mesh axes, ``jax.lax.all_to_all`` semantics.

The primitive exchanges n blocks along axis 0 (block j to member j, block i
of the result from member i); ``split_axis``, ``concat_axis`` and ``tiled``
are moves and reshapes around it, done exactly as ``lax.all_to_all`` does.
It is its own transpose.
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
    check_dtype("all_to_all", x.dtype)
    if x.shape[0] % group.size:
        raise ValueError(f"all_to_all: the split axis has size {x.shape[0]}, not a multiple of the "
                         f"{group.size} members")
    return x


def _run(comm: Communicator, ins: list[np.ndarray], outs: list[np.ndarray], same: bool) -> None:
    if same:
        comm.all_to_all(outs[0]).wait()
    else:
        comm.all_to_all(ins[0], out=outs[0]).wait()


all_to_all_p = define("all_to_all", abstract=_abstract, run=_run, alias=True)
def_linear(all_to_all_p, lambda ct, pos, *, group: all_to_all_p.bind(ct, pos, group=group))
def_batching(all_to_all_p, axis0=True)


def _tiled(v: Any, pos: Any, group: Group, split: int, concat: int) -> Any:
    n = group.size
    moved = jnp.moveaxis(v, split, 0)
    out = all_to_all_p.bind(moved, pos, group=group)  # block i came from member i
    chunks = out.reshape(n, moved.shape[0] // n, *moved.shape[1:])
    chunks = jnp.moveaxis(chunks, 1, split + 1)  # (n, *v.shape with the split axis divided by n)
    chunks = jnp.moveaxis(chunks, 0, concat)  # member index just before the concat axis: concatenate
    shape = list(chunks.shape)
    shape[concat:concat + 2] = [shape[concat] * shape[concat + 1]]
    return chunks.reshape(shape)


def all_to_all(x: Any, axis_name: Any = None, split_axis: int = 0, concat_axis: int = 0, *, tiled: bool = False,
               comm: Communicator | None = None) -> Any:
    """Split ``split_axis`` into n chunks, send chunk j to member j, concatenate what arrives along
    ``concat_axis`` (``tiled=False``: the split axis must have size n and is replaced by the new axis)."""
    return in_process.placed(
        "all_to_all", axis_name, x, lambda v: jax.tree_util.tree_map(
            lambda w: in_process.lax("all_to_all")(w, axis_name, split_axis, concat_axis, tiled=tiled), v),
        lambda v: _all_to_all(v, axis_name, split_axis, concat_axis, tiled, comm))


def _all_to_all(x: Any, axis_name: Any, split_axis: int, concat_axis: int, tiled: bool,
                comm: Communicator | None) -> Any:
    group, pos = group_for("all_to_all", axis_name, comm)
    n = group.size

    def one(v: Any) -> Any:
        v = varying_in(group, jnp.asarray(v))
        split, concat = split_axis % v.ndim, concat_axis % v.ndim
        if tiled:
            if v.shape[split] % n:
                raise ValueError(f"all_to_all: split axis {split} of shape {v.shape} is not a multiple of {n}")
            return _tiled(v, pos, group, split, concat)
        if v.shape[split] != n:
            raise ValueError(f"all_to_all: with tiled=False, split axis {split} must have size {n}, "
                             f"got shape {v.shape}")
        if split < concat:  # concat_axis counts positions after the split axis is removed (as lax)
            concat += 1
            v = jnp.expand_dims(v, concat)
        elif concat < split:
            v = jnp.expand_dims(v, concat)
            split += 1
        out = _tiled(v, pos, group, split, concat)
        return jnp.squeeze(out, split) if split != concat else out

    return jax.tree_util.tree_map(one, x)
