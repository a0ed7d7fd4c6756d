"""``all_reduce`` (process-level) and ``psum`` / ``pmax`` / ``pmin`` / ``pmean`` (mesh-level).

Autodiff follows jax.lax and mpi4jax, which agree: the result of a sum is
one value that every rank holds a copy of, so its cotangent comes back
unchanged, not summed again. ``psum`` under ``check_vma`` transposes to
the invariant -> varying cast, as ``lax.psum`` does; the process-level
``all_reduce`` to ``all_reduce_transpose_p``, the identity (``avg``: / n)
whose own transpose is the all_reduce again, as mpi4jax's is (so
``linear_transpose`` twice gives the op back). Without ``check_vma``,
``psum`` transposes to ``psum``, as ``lax.psum`` then does. ``max``, ``min``
and ``prod`` have no derivative (nor ``lax.pmax`` / ``lax.pmin``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from aioccl import Communicator, ReduceOp

from . import _compat, in_process
from ._primitive import (
    AxisGroup,
    Group,
    as_array,
    check_reduction,
    def_batching,
    def_reduction_jvp,
    define,
    dense,
    group_for,
    parse_op,
    varying_in,
)


def _abstract(x: Any, pos: Any, *, group: Group, op: str) -> Any:
    check_reduction("all_reduce", op, x.dtype)
    if isinstance(group, AxisGroup) and _compat.check_vma():
        return _compat.with_varying(x, _compat.varying(x) - set(group.axes))
    return x


def _run(comm: Communicator, ins: list[np.ndarray], outs: list[np.ndarray], same: bool, *, op: str) -> None:
    if same:
        comm.all_reduce(outs[0], op).wait()
    else:
        comm.all_reduce(ins[0], op, out=outs[0]).wait()


all_reduce_p = define("all_reduce", abstract=_abstract, run=_run, alias=True, first=in_process.reduction_first)


def _transpose(ct: Any, x: Any, pos: Any, *, group: Group, op: str) -> Any:
    ct = dense(ct)
    if isinstance(group, AxisGroup):
        if _compat.check_vma():
            return _compat.pvary(ct, group.axes), None  # the invariant -> varying cast, like lax.psum's
        return all_reduce_p.bind(ct, pos, group=group, op=op), None
    return all_reduce_transpose_p.bind(ct, pos, group=group, op=op), None


def _transposed(ct: Any, pos: Any, *, group: Group, op: str) -> Any:
    return ct / group.size if op == "avg" else ct


# the cotangent of a value every rank holds a copy of: local, no communication; transposes back to all_reduce
all_reduce_transpose_p = _compat.new_local_primitive("aioccl_all_reduce_transpose", _transposed)


def _transposed_jvp(primals: Any, tangents: Any, **params: Any) -> Any:
    ct, pos = primals
    return (all_reduce_transpose_p.bind(ct, pos, **params),
            all_reduce_transpose_p.bind(_compat.instantiate_zeros(tangents[0]), pos, **params))


def _transposed_transpose(ct: Any, x: Any, pos: Any, **params: Any) -> Any:
    return all_reduce_p.bind(dense(ct), pos, **params), None


def_reduction_jvp(all_reduce_p, "all_reduce")
_compat.def_transpose(all_reduce_p, _transpose)
def_batching(all_reduce_p, axis0=False)
_compat.def_jvp(all_reduce_transpose_p, _transposed_jvp)
_compat.def_transpose(all_reduce_transpose_p, _transposed_transpose)
def_batching(all_reduce_transpose_p, axis0=False)


def _bind(api: str, x: Any, op: str | ReduceOp, axis_name: Any, comm: Communicator | None) -> Any:
    return _bind_group(x, op, *group_for(api, axis_name, comm), api=api)


def _bind_group(x: Any, op: str | ReduceOp, group: Group, pos: Any, api: str = "all_reduce") -> Any:
    op = parse_op(op)

    def one(leaf: Any) -> Any:
        v = varying_in(group, as_array(leaf))
        return _widened(api, v, op, lambda w: all_reduce_p.bind(w, pos, group=group, op=op))

    return jax.tree_util.tree_map(one, x)


_WIDER = {np.dtype(np.int16): jnp.int32, np.dtype(np.uint16): jnp.uint32}


def _widened(api: str, v: Any, op: str, reduce: Any) -> Any:
    """Reduce ``v``, taking what ``lax.psum`` takes that aioccl's wire does not: 16-bit integers as 32-bit
    ones (the low 16 bits of a sum, product, max or min are the 16-bit result: it wraps as lax's does), and
    complex numbers as their real and imaginary parts side by side (sum and average only: complex numbers
    have no order, and a product mixes the parts)."""
    dt = check_leaf(api, op, v.dtype)
    if dt.kind == "c":
        parts = reduce(jnp.stack([jnp.real(v), jnp.imag(v)], axis=-1))
        return jax.lax.complex(parts[..., 0], parts[..., 1])
    if dt in _WIDER:
        return reduce(v.astype(_WIDER[dt])).astype(dt)
    return reduce(v)


def check_leaf(api: str, op: str, dtype: Any) -> np.dtype:
    """``dtype`` if a reduction ``op`` takes it (as ``_widened`` carries it), else TypeError naming ``api``."""
    dt: np.dtype[Any] = np.dtype(dtype)
    if dt.kind == "c":
        if op not in ("sum", "avg"):
            raise TypeError(f"{api}: op {op!r} on complex values: only sum and avg (complex numbers have no "
                            "order; a product mixes real and imaginary parts)")
        check_reduction(api, op, np.dtype(dt.char.lower()) if dt.char in "FD" else dt)
    else:
        check_reduction(api, op, np.dtype(_WIDER[dt]) if dt in _WIDER else dt)
    return dt


def all_reduce(x: Any, op: str | ReduceOp = "sum", *, comm: Communicator | None = None) -> Any:
    """Reduce ``x`` across the processes of ``comm``; jit-able.

    ``comm`` defaults to [`default_comm()`][jax_ext.runtime.default_comm], one rank per process.
    """
    return _bind("all_reduce", x, op, None, comm)


def psum(x: Any, axis_name: Any) -> Any:
    """``jax.lax.psum`` over mesh axes (inside ``shard_map``): XLA's among this process's devices, aioccl's
    across processes (``in_process.py``)."""
    return in_process.placed("psum", axis_name, x, lambda v: in_process.lax("psum")(v, axis_name),
                             lambda v: _bind("psum", v, "sum", axis_name, None),
                             lambda d: check_leaf("psum", "sum", d))


def pmax(x: Any, axis_name: Any) -> Any:
    """Elementwise maximum over the mesh axis (or axes) ``axis_name``, as ``jax.lax.pmax``."""
    return in_process.placed("pmax", axis_name, x, lambda v: in_process.lax("pmax")(v, axis_name),
                             lambda v: _bind("pmax", v, "max", axis_name, None),
                             lambda d: check_leaf("pmax", "max", d))


def pmin(x: Any, axis_name: Any) -> Any:
    """Elementwise minimum over the mesh axis (or axes) ``axis_name``, as ``jax.lax.pmin``."""
    return in_process.placed("pmin", axis_name, x, lambda v: in_process.lax("pmin")(v, axis_name),
                             lambda v: _bind("pmin", v, "min", axis_name, None),
                             lambda d: check_leaf("pmin", "min", d))


def pmean(x: Any, axis_name: Any) -> Any:
    """``psum`` divided by the group size, like ``jax.lax.pmean`` (bit for bit)."""
    return in_process.placed("pmean", axis_name, x, lambda v: in_process.lax("pmean")(v, axis_name),
                             lambda v: _pmean(v, axis_name), lambda d: check_leaf("pmean", "avg", d))


def _pmean(x: Any, axis_name: Any) -> Any:
    group, pos = group_for("pmean", axis_name, None)
    return jax.tree_util.tree_map(lambda v: v / group.size, _bind_group(x, "sum", group, pos, api="pmean"))
