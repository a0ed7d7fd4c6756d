"""Turn what users pass (numpy, JAX, DLPack or buffer-protocol objects) into one view.

Everything below the API works on :class:`Buf`: a C-contiguous numpy array
(the caller's memory, never a copy, unless the input is immutable) plus a
function that turns the filled array back into what the caller expects to
get: the same numpy array, the same torch tensor, or a new JAX array.
Validation lives here so every op rejects bad input *before* a byte moves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .dtypes import dtype_code
from .errors import InvalidArgument


@dataclass(slots=True)
class Buf:
    array: np.ndarray  # C-contiguous view of the user's memory (or a private copy if immutable)
    writable: bool  # whether results may be written into the user's memory
    wrap: Callable[[np.ndarray], Any]  # filled array -> what the caller gets back
    owner: Any = None  # the user's object
    immutable: bool = False  # JAX arrays: results always go to a new array

    @property
    def flat(self) -> np.ndarray:
        return self.array.reshape(-1)


def _is_jax(x: Any) -> bool:
    return type(x).__module__.startswith(("jax", "jaxlib"))


def _jax_wrap(arr: np.ndarray) -> Any:
    import jax.numpy as jnp  # imported only when a JAX array was passed in

    return jnp.asarray(arr)


def adapt(x: Any, name: str) -> Buf:
    """Validate and view ``x``; raises :class:`InvalidArgument` with the argument's name."""
    if x is None:
        raise InvalidArgument(f"{name} is None")
    if isinstance(x, np.ndarray):
        arr, writable, wrap = x, x.flags.writeable, (lambda a, _x=x: _x if a is _x else a)
    elif hasattr(x, "__cuda_array_interface__"):
        raise InvalidArgument(f"{name}: {type(x).__name__} lives in GPU memory; this build moves host (CPU) "
                              "buffers only")
    elif _is_jax(x):
        arr = np.asarray(x)  # zero-copy, read-only on CPU; results go to a fresh array
        writable, wrap = False, _jax_wrap
    elif hasattr(x, "__dlpack__"):
        device = getattr(x, "__dlpack_device__", lambda: (1, 0))()
        if device[0] != 1:  # kDLCPU
            raise InvalidArgument(f"{name}: {type(x).__name__} is on DLPack device {tuple(device)}, not the CPU; "
                                  "this build moves host (CPU) buffers only")
        try:
            arr = np.from_dlpack(x)
        except (BufferError, TypeError, RuntimeError) as e:
            raise InvalidArgument(f"{name}: cannot view {type(x).__name__} through DLPack: {e}") from None
        writable, wrap = arr.flags.writeable, (lambda a, _x=x: _x)
    else:
        try:
            arr = np.asarray(memoryview(x))
        except TypeError:
            raise InvalidArgument(
                f"{name}: expected a numpy/JAX array or an object with __dlpack__ or the buffer protocol, "
                f"got {type(x).__name__}"
            ) from None
        writable, wrap = arr.flags.writeable, (lambda a, _x=x: _x)
    dtype_code(arr.dtype)  # raises InvalidArgument for unsupported dtypes
    immutable = wrap is _jax_wrap
    if not arr.flags.c_contiguous:
        raise InvalidArgument(f"{name} is not C-contiguous (strides {arr.strides}); pass np.ascontiguousarray(...)")
    return Buf(arr, writable, wrap, x, immutable)


def need_writable(buf: Buf, name: str) -> None:
    if not buf.writable:
        raise InvalidArgument(f"{name} is read-only; results cannot be written into it")


def check_same(a: Buf, b: Buf, what: str, shape: tuple[int, ...] | None = None) -> None:
    """``b`` must have ``a``'s dtype and the given shape (``a``'s by default)."""
    want = a.array.shape if shape is None else shape
    if b.array.dtype != a.array.dtype:
        raise InvalidArgument(f"{what}: dtype {b.array.dtype.name} does not match input dtype {a.array.dtype.name}")
    if b.array.shape != want:
        raise InvalidArgument(f"{what}: shape {b.array.shape} does not match the expected shape {want}")


def fresh(shape: tuple[int, ...], like: Buf) -> Buf:
    """A new output array shaped ``shape`` returned in ``like``'s flavour (numpy or JAX)."""
    arr = np.empty(shape, dtype=like.array.dtype)
    if like.wrap is _jax_wrap:
        return Buf(arr, True, _jax_wrap)
    return Buf(arr, True, lambda a: a)


def overlaps(a: np.ndarray, b: np.ndarray) -> bool:
    return a.size > 0 and b.size > 0 and np.shares_memory(a, b)


def byte_view(arr: np.ndarray) -> memoryview:
    """A flat writable-or-not byte memoryview of a contiguous array of any dtype."""
    return memoryview(arr.reshape(-1).view(np.uint8))
