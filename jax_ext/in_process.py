"""Mesh-level ops among devices of one process: XLA's collectives where they are faster; aioccl carries the rest.

Why: XLA runs a collective among the devices of one process inside one executable, over memory those
devices share, with no host call and no per-device communicator. From some size on, aioccl's path for the
same op (a custom call per device, a rank per device meeting in shared memory) cannot keep up: at 1 MiB per
device it measured 0.21-0.66x lax's speed. Below it, aioccl's native custom call wins: at 8 B it measured
4-8x faster than XLA's in-process collectives on CPU (docs/benchmarks.md, "jax_ext's mesh-level ops in one
process"). aioccl is for what crosses a process boundary, and for the small ops it runs faster.

``AIOCCL_JAX_MESH`` says who runs the in-process part: ``auto`` (the default: XLA from
``AIOCCL_JAX_MESH_BYTES`` per device on, and at every size where aioccl's native custom call would not run
the op: on a GPU, or with the native core off), ``xla`` (XLA at every size: a one-process program then holds
no aioccl custom call) or ``aioccl`` (aioccl at every size, as before; A/B runs and the tests of aioccl's own
mesh path). Two decisions follow it:

- **At trace time** (``placed``): in a one-process program (``jax.process_count() == 1``) every device of
  every mesh is this process's, so an op with a ``jax.lax`` equivalent (psum, pmax, pmin, pmean, all_gather,
  psum_scatter, all_to_all, ppermute; broadcast as the root's block of ``lax.all_gather``) that XLA takes
  *is* that lax op, leaf by leaf. send, recv, sendrecv and barrier have none and stay aioccl's.
- **At lowering** (``reduction_first``): across processes, only the concrete mesh says which axes stay
  inside a process, and JAX gives it at lowering, not at trace time. A reduction (psum, pmax, pmin; pmean is
  a psum) that XLA takes, over axes that all stay inside each process, lowers to lax's; over a mix, lax's over
  the in-process axes first, then aioccl's over the rest (hierarchical). An axis *stays inside a process*
  when every step along it, from every device, reaches a device of the same process.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np

from . import _compat, native_call
from ._primitive import AxisGroup, check_dtype, mesh_axes

MODES = ("auto", "xla", "aioccl")
DEFAULT_BYTES = 128 << 10  # auto: XLA from here on (per device); where the two crossed on CPU (docs/benchmarks.md)


def mode() -> str:
    """``AIOCCL_JAX_MESH``: ``auto`` (the default), ``xla`` or ``aioccl`` (see the module's docstring)."""
    value = os.environ.get("AIOCCL_JAX_MESH", "auto").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"AIOCCL_JAX_MESH={value!r}: expected one of {', '.join(MODES)}")
    return value


def xla_from() -> int:
    """``AIOCCL_JAX_MESH_BYTES``: with ``auto``, the bytes per device from which XLA runs an in-process op."""
    text = os.environ.get("AIOCCL_JAX_MESH_BYTES", "").strip()
    try:
        value = int(text) if text else DEFAULT_BYTES
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"AIOCCL_JAX_MESH_BYTES={text!r}: expected a number of bytes >= 0")
    return value


def xla_takes(nbytes: int) -> bool:
    """Whether XLA runs the in-process part of an op of ``nbytes`` per device."""
    m = mode()
    if m != "auto":
        return m == "xla"
    return nbytes >= xla_from() or jax.default_backend() != "cpu" or native_call.why_not() is not None


def nbytes(leaf: Any) -> int:
    """Bytes of an array, a Python or numpy scalar, or an abstract value (``aval``)."""
    shape = getattr(leaf, "shape", None)
    dtype = getattr(leaf, "dtype", None)
    return (math.prod(jnp.shape(leaf) if shape is None else shape)
            * np.dtype(jnp.result_type(leaf) if dtype is None else dtype).itemsize)


def placed(api: str, axis_name: Any, x: Any, theirs: Callable[[Any], Any], ours: Callable[[Any], Any],
           check: Callable[[np.dtype[Any]], Any] | None = None) -> Any:
    """The op ``api`` over ``axis_name`` on the pytree ``x``: ``theirs(leaf)`` (jax.lax's) for each leaf XLA
    takes in a one-process program, ``ours`` (aioccl's) for the rest. What aioccl's path checks is checked
    first, with its errors (the axis names; each leaf's dtype, by ``check``, else ``check_dtype``): a program
    that traces in one process traces across processes too."""
    if axis_name is None or jax.process_count() != 1:
        return ours(x)
    mesh_axes(api, axis_name)
    leaves = jax.tree_util.tree_leaves(x)
    for leaf in leaves:
        dtype = np.dtype(jnp.result_type(leaf))
        check(dtype) if check is not None else check_dtype(api, dtype)
    takes = [xla_takes(nbytes(leaf)) for leaf in leaves]
    if not any(takes):
        return ours(x)
    if all(takes):
        return theirs(x)
    return jax.tree_util.tree_map(lambda v: theirs(v) if xla_takes(nbytes(v)) else ours(v), x)


def lax(name: str) -> Callable[..., Any]:
    """``jax.lax``'s collective ``name`` (untyped in some jax releases' stubs: called through here)."""
    return cast(Callable[..., Any], getattr(jax.lax, name))


def group_size(api: str, axis_name: Any) -> int:
    """The number of members along ``axis_name`` (one axis or several) in the current mesh; the names
    checked first, with aioccl's errors."""
    axes, _ = mesh_axes(api, axis_name)
    _, sizes = _compat.manual_mesh_axes()
    return math.prod(sizes[a] for a in axes)


def split(mesh: Any, axes: Sequence[Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``axes`` as (those that stay inside a process, the others), each in the order given."""
    procs = np.vectorize(lambda d: int(d.process_index), otypes=[np.int64])(np.asarray(mesh.devices))
    names = list(mesh.axis_names)
    inside = tuple(a for a in axes if _stays_inside(procs, names.index(a)))
    return inside, tuple(a for a in axes if a not in inside)


def _stays_inside(procs: np.ndarray, dim: int) -> bool:
    """Every device along mesh dimension ``dim`` is in the process of the first one."""
    first = np.take(procs, [0], axis=dim)
    return bool(np.all(procs == first))


LAX_REDUCTIONS = {"sum": "psum", "max": "pmax", "min": "pmin"}


def reduction_first(info: _compat.LoweringInfo, aval: Any, *, group: Any, op: str, **params: Any) -> Any:
    """all_reduce's XLA part (``_compat.FirstPart``): over a mesh's axes that stay inside each process, lax's
    reduction; then, over the others, aioccl's op on its result (hierarchical), or nothing more. None where
    no axis stays inside (or the op is a process-level one, or not a lax reduction)."""
    if not isinstance(group, AxisGroup) or op not in LAX_REDUCTIONS or not xla_takes(nbytes(aval)):
        return None
    mesh = info.concrete_mesh()
    if mesh is None:
        return None  # (aioccl's lowering says why it cannot run without one)
    inside, across = split(mesh, group.axes)
    if not inside:
        return None
    reduce = lax(LAX_REDUCTIONS[op])

    def first(x: Any) -> Any:
        return reduce(x, inside)

    if not across:
        return first, None
    sizes = dict(zip(mesh.axis_names, np.asarray(mesh.devices).shape, strict=True))
    return first, {**params, "op": op, "group": AxisGroup(across, math.prod(sizes[a] for a in across), group.api)}
