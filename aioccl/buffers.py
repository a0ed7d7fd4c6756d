"""Turn what users pass (numpy, JAX, DLPack or buffer-protocol objects) into one view.

Everything below the API works on ``Buf``: a C-contiguous numpy array,
or for GPU memory a ``DevArray`` (the caller's
memory, never a copy, unless the input is immutable) plus a function that
turns the filled array back into what the caller expects to get: the same
numpy or cupy array, the same torch tensor (CPU ones through
``aioccl.tensors``), or a new JAX array.
Validation lives here so every op rejects bad input *before* a byte moves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import tensors as _torch
from .dtypes import dtype_code
from .errors import InvalidArgument


@dataclass(slots=True)
class Buf:
    array: Any  # np.ndarray or DevArray: C-contiguous view of the user's memory (or a private copy if immutable)
    writable: bool  # whether results may be written into the user's memory
    wrap: Callable[[Any], Any]  # filled array (numpy or DevArray) -> what the caller gets back
    owner: Any = None  # the user's object
    immutable: bool = False  # JAX arrays: results always go to a new array

    @property
    def flat(self) -> Any:
        return self.array.reshape(-1)

    @property
    def device(self) -> int | None:
        """The CUDA device ordinal of GPU buffers; None for host memory."""
        return None if isinstance(self.array, np.ndarray) else self.array.device


def _is_jax(x: Any) -> bool:
    return type(x).__module__.split(".")[0] in ("jax", "jaxlib")


def _jax_wrap(arr: np.ndarray) -> Any:
    import jax.numpy as jnp  # imported only when a JAX array was passed in

    return jnp.asarray(arr)


def _itself(a: np.ndarray) -> np.ndarray:
    """A numpy argument's results are the filled array itself (the argument, or a view of it)."""
    return a


def _always(x: Any) -> Callable[[np.ndarray], Any]:
    return lambda _a: x


def adapt(x: Any, name: str) -> Buf:
    """Validate and view ``x``; raises ``InvalidArgument`` with the argument's name."""
    if x is None:
        raise InvalidArgument(f"{name} is None")
    arr: np.ndarray
    wrap: Callable[[np.ndarray], Any]
    if type(x) is np.ndarray:  # the usual argument, checked with one look at its flags
        flags = x.flags
        dtype_code(x.dtype)
        if not flags.c_contiguous:
            raise InvalidArgument(f"{name} is not C-contiguous (strides {x.strides}); pass np.ascontiguousarray(...)")
        return Buf(x, flags.writeable, _itself, x)
    if isinstance(x, np.ndarray):
        arr, writable, wrap = x, x.flags.writeable, _itself
    elif _torch.is_tensor(x) and not x.is_cuda:  # before the GPU probe, whose hasattr costs a CPU tensor 3 us
        arr = _torch.view(x, name)
        writable, wrap = True, _torch.wrapper(x, arr)
    elif _on_gpu(x):
        from .gpu.arrays import adapt_device

        dev, writable, dev_wrap, immutable = adapt_device(x, name)
        dtype_code(dev.dtype)
        if not dev.flags.c_contiguous:
            raise InvalidArgument(f"{name} is not C-contiguous (strides {dev.data.strides}); make a contiguous copy")
        return Buf(dev, writable, dev_wrap, x, immutable)
    elif _is_jax(x):
        arr = np.asarray(x)  # zero-copy, read-only on CPU; results go to a fresh array
        writable, wrap = False, _jax_wrap
    elif hasattr(x, "__dlpack__"):
        device = getattr(x, "__dlpack_device__", lambda: (1, 0))()
        if device[0] != 1:  # kDLCPU (CUDA devices were taken above)
            raise InvalidArgument(f"{name}: {type(x).__name__} is on DLPack device {tuple(device)}, which is "
                                  "neither the CPU nor a CUDA GPU")
        try:
            arr = np.from_dlpack(x)
        except (BufferError, TypeError, RuntimeError) as e:
            raise InvalidArgument(f"{name}: cannot view {type(x).__name__} through DLPack: {e}") from None
        writable, wrap = arr.flags.writeable, _always(x)
    else:
        try:
            arr = np.asarray(memoryview(x))
        except TypeError:
            raise InvalidArgument(
                f"{name}: expected a numpy/JAX array or an object with __dlpack__ or the buffer protocol, "
                f"got {type(x).__name__}"
            ) from None
        writable, wrap = arr.flags.writeable, _always(x)
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


def _on_gpu(x: Any) -> bool:
    from .gpu.arrays import is_device_object  # no cupy import: it only looks at the object

    return is_device_object(x)


def fresh(shape: tuple[int, ...], like: Buf) -> Buf:
    """A new output array shaped ``shape`` returned in ``like``'s flavour (numpy, cupy or JAX), on its device."""
    if like.device is not None:
        from .gpu.arrays import empty

        dev = empty(shape, like.array.dtype, like.device)
        return Buf(dev, True, like.wrap if like.immutable else (lambda a: a.data), immutable=False)
    arr = np.empty(shape, dtype=like.array.dtype)
    if like.wrap is _jax_wrap:
        return Buf(arr, True, _jax_wrap)
    if _torch.is_tensor(like.owner):
        return Buf(arr, True, _torch.new_tensor)
    return Buf(arr, True, lambda a: a)


def overlaps(a: Any, b: Any) -> bool:
    """Whether two buffers share memory (a host and a GPU buffer never do)."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.size > 0 and b.size > 0 and np.shares_memory(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return False
    from .gpu.arrays import same_memory

    return same_memory(a, b)


def identical(a: Any, b: Any) -> bool:
    """Whether two buffers are the very same memory (same first byte, same length): in place."""
    return bool(a.nbytes == b.nbytes and a.nbytes and address(a) == address(b) and
                isinstance(a, np.ndarray) == isinstance(b, np.ndarray))


def address(arr: Any) -> int:
    """The first byte's address (host or device)."""
    return int(arr.__array_interface__["data"][0]) if isinstance(arr, np.ndarray) else arr.ptr


def same_device(what: str, *bufs: Buf) -> int | None:
    """The one device all ``bufs`` are on (None: host); mixing devices is an ``InvalidArgument``."""
    devices = {b.device for b in bufs}
    if len(devices) > 1:
        names = sorted("host" if d is None else f"cuda:{d}" for d in devices)
        raise InvalidArgument(f"{what}: buffers on different devices ({', '.join(names)}); pass all of one "
                              "call's buffers on the same device")
    return devices.pop()


def byte_view(arr: np.ndarray) -> memoryview:
    """A flat writable-or-not byte memoryview of a contiguous array of any dtype."""
    try:
        return memoryview(arr).cast("B")  # type: ignore[arg-type]  # one C call for the usual array, where numpy takes three
    except (TypeError, ValueError, NotImplementedError):  # a dtype the buffer protocol cannot say
        return arr.reshape(-1).view(np.uint8).data


# -- the overlap rules (docs/api.md's shape table), one place for every op -------------------------
def output_like(x: Buf, out: Any, shape: tuple[int, ...], name: str = "out") -> Buf:
    """``out`` checked as an op's output of ``shape`` and x's dtype and device, or a fresh array."""
    if out is None:
        return fresh(shape, x)
    ob = adapt(out, name)
    need_writable(ob, name)
    check_same(x, ob, name, shape)
    return ob


def same_or_disjoint(name: str, xb: Buf, out: Any) -> Buf:
    """``out`` for an op whose output has x's shape: the very memory of ``x`` (in place) or disjoint.

    A partial overlap would let the schedule read bytes it has already overwritten, which gives
    wrong results without any error, so it is refused here, before anything is sent.
    """
    ob = output_like(xb, out, xb.array.shape)
    if ob.array is xb.array or not overlaps(ob.array, xb.array):
        return ob
    if identical(ob.array, xb.array):  # another view of the same memory: in place, on x's own array
        return Buf(xb.array, ob.writable, ob.wrap, ob.owner, ob.immutable)
    raise InvalidArgument(f"{name}: out partially overlaps x; pass x itself (or omit out=) for in place, "
                          "or memory disjoint from x")


def no_foreign_overlap(small: Buf, big: Buf, block: int, name: str) -> None:
    """``small`` may be exactly ``big``'s block ``block`` (NCCL-style in place), nothing else."""
    if not overlaps(small.array, big.array):
        return
    n = small.array.size
    exact = big.array.reshape(-1)[block * n:(block + 1) * n]
    if address(small.array) != address(exact):
        raise InvalidArgument(f"{name}: the {n}-element buffer overlaps the {big.array.size}-element one other "
                              f"than as its block {block} (the only overlap the op allows)")
