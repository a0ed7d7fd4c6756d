"""GPU buffers as the rest of aioccl sees them.

``DevArray`` is the GPU counterpart of the numpy array inside a
``Buf``: it answers ``shape``, ``dtype``, ``size``,
slicing and ``reshape`` the way the argument checks in ``collectives.py``
expect, so every op validates GPU and host buffers with the same code.

cupy has no bfloat16, so a bfloat16 buffer is stored as a uint16 cupy array
and its logical dtype travels beside it (``DevArray.dtype``); the kernels in
``aioccl.kernels.gpu`` pick their code by the logical dtype.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from ..errors import InvalidArgument
from ..kernels.gpu import storage_dtype
from .probe import load_cupy

KDL_CUDA, KDL_CUDA_MANAGED = 2, 13  # DLPack device types aioccl can use as GPU memory


class DevArray:
    """A C-contiguous cupy array (``data``) with its logical numpy dtype and device ordinal; ``stream``: the
    stream its owner orders work on (torch's current stream for a torch tensor), the op's default."""

    __slots__ = ("data", "dtype", "device", "stream")

    def __init__(self, data: Any, dtype: np.dtype, device: int, stream: int | None = None) -> None:
        self.data = data
        self.dtype = np.dtype(dtype)
        self.device = device
        self.stream = stream

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def size(self) -> int:
        return int(self.data.size)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    @property
    def ptr(self) -> int:
        return int(self.data.data.ptr)

    @property
    def flags(self) -> Any:
        return self.data.flags

    def reshape(self, *shape: Any) -> DevArray:
        return DevArray(self.data.reshape(*shape), self.dtype, self.device, self.stream)

    def __getitem__(self, key: Any) -> DevArray:
        return DevArray(self.data[key], self.dtype, self.device, self.stream)

    def __setitem__(self, key: Any, value: DevArray) -> None:
        self.data[key] = value.data

    def __repr__(self) -> str:
        return f"<DevArray {self.dtype.name}{list(self.shape)} on cuda:{self.device}>"


_CUPY_ARRAY: list[type] = []  # cupy.ndarray, once cupy is loaded: the common case in one look


def is_device_object(x: Any) -> bool:
    """Whether ``x`` lives in GPU memory, judged without importing cupy."""
    if _CUPY_ARRAY and type(x) is _CUPY_ARRAY[0]:
        return True
    if _is_torch(x):  # its __cuda_array_interface__ raises TypeError (bfloat16) or RuntimeError (requires_grad)
        return getattr(getattr(x, "device", None), "type", None) == "cuda"
    if hasattr(x, "__cuda_array_interface__"):
        return True
    dev = getattr(x, "__dlpack_device__", None)
    if dev is None or isinstance(x, np.ndarray):
        return False
    try:
        return int(dev()[0]) in (KDL_CUDA, KDL_CUDA_MANAGED)
    except Exception:  # noqa: BLE001 - an odd object: let the host path judge it
        return False


def empty(shape: tuple[int, ...], dtype: np.dtype, device: int) -> DevArray:
    """A new GPU array on ``device`` (from cupy's pool: results handed back to the caller)."""
    cp = load_cupy("a GPU output")
    with cp.cuda.Device(device):
        return DevArray(cp.empty(shape, dtype=storage_dtype(dtype)), dtype, device)


def adapt_device(x: Any, name: str) -> tuple[DevArray, bool, Callable[[DevArray], Any], bool]:
    """View GPU object ``x`` as a DevArray without copying: ``(array, writable, wrap, immutable)``."""
    cp = load_cupy(f"{name} ({type(x).__name__}, in GPU memory)")
    if not _CUPY_ARRAY:
        _CUPY_ARRAY.append(cp.ndarray)
    is_jax = type(x).__module__.split(".")[0] in ("jax", "jaxlib")
    if isinstance(x, cp.ndarray):
        arr = DevArray(x, _logical(x, x.dtype), x.device.id)
        return arr, True, (lambda a, _x=x: _x if a.data is _x else a.data), False
    what = f"{name} ({type(x).__name__}, in GPU memory)"
    if _is_torch(x):
        return _from_torch(cp, x, what)
    if hasattr(x, "__cuda_array_interface__"):
        try:
            arr, readonly = _from_cai(cp, x, what)
        except InvalidArgument:
            raise
        except Exception as e:  # noqa: BLE001 - a bad pointer: the CUDA runtime says why
            raise InvalidArgument(f"{what}: cannot view it through __cuda_array_interface__: {e}") from None
    else:
        try:
            data = cp.from_dlpack(x)
        except Exception as e:  # noqa: BLE001 - cupy raises several kinds
            raise InvalidArgument(f"{what}: cannot view it through DLPack: {e}") from None
        arr, readonly = DevArray(data, _logical(x, data.dtype), data.device.id), False
    if is_jax:
        return arr, False, _jax_wrap, True
    owner = x
    return arr, not readonly, (lambda a, _x=owner, _d=arr.data: _x if a.data is _d else a.data), False


def _is_torch(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def _from_torch(cp: Any, x: Any, what: str) -> tuple[DevArray, bool, Callable[[DevArray], Any], bool]:
    """A torch CUDA tensor: viewed through ``detach()`` (same storage; a tensor that requires grad refuses
    to export, and like torch.distributed the op is invisible to autograd), bfloat16 as int16 bits
    relabelled, ordered on torch's current stream for its device (what torch's own kernels use)."""
    torch = sys.modules["torch"]
    t = x.detach()
    logical = np.dtype(ml_dtypes.bfloat16) if t.dtype == torch.bfloat16 else None
    if logical is not None:
        t = t.view(torch.int16)
    try:
        arr, _ = _from_cai(cp, t, what)
    except InvalidArgument:
        raise
    except Exception as e:  # noqa: BLE001 - unsupported dtype (bool, complex) or a bad pointer
        raise InvalidArgument(f"{what}: cannot view the {t.dtype} tensor through __cuda_array_interface__: {e}"
                              ) from None
    if logical is not None:
        arr.dtype, arr.data = logical, arr.data.view(storage_dtype(logical))
    arr.stream = int(torch.cuda.current_stream(t.device).cuda_stream)
    tensor, mine = x, arr.data

    def wrap(a: DevArray) -> Any:
        if a.data is mine:
            return tensor
        out = torch.as_tensor(a.data, device=t.device)  # a fresh output: shares the cupy array's memory
        return out.view(torch.bfloat16) if logical is not None else out

    return arr, True, wrap, False


def _logical(x: Any, fallback: Any) -> np.dtype:
    """The object's own numpy dtype where it has one (JAX, XLA buffers: bfloat16 included), else ``fallback``."""
    try:
        dt: np.dtype = np.dtype(x.dtype)
    except TypeError:  # torch.dtype and friends
        dt = np.dtype(fallback)
    return dt


def _from_cai(cp: Any, x: Any, name: str) -> tuple[DevArray, bool]:
    cai = x.__cuda_array_interface__
    shape = tuple(int(d) for d in cai["shape"])
    logical = _logical(x, cai["typestr"])
    try:
        stored = storage_dtype(logical)
    except KeyError:
        stored = np.dtype(cai["typestr"])  # unsupported: dtype_code() names it next
    strides = cai.get("strides")
    if strides is not None:
        want = tuple(int(s) for s in np.empty(shape, dtype=stored).strides) if shape else ()
        if tuple(int(s) for s in strides) != want and int(np.prod(shape)) > 1:
            raise InvalidArgument(f"{name} is not C-contiguous (strides {tuple(strides)}); make a contiguous copy")
    ptr, readonly = cai["data"]
    nbytes = int(np.prod(shape)) * stored.itemsize
    mem = cp.cuda.UnownedMemory(int(ptr), nbytes, x) if nbytes else None
    device = cp.cuda.runtime.pointerGetAttributes(int(ptr)).device if nbytes else cp.cuda.runtime.getDevice()
    memptr = cp.cuda.MemoryPointer(mem, 0) if mem is not None else None
    data = cp.ndarray(shape, dtype=stored, memptr=memptr)
    return DevArray(data, logical, int(device)), bool(readonly)


def _jax_wrap(a: DevArray) -> Any:
    import jax.dlpack

    out = jax.dlpack.from_dlpack(a.data)
    return out.view(a.dtype) if out.dtype != a.dtype else out


def same_memory(a: DevArray, b: DevArray) -> bool:
    """Whether two GPU arrays share any byte (same device, intersecting address ranges)."""
    if a.device != b.device or not a.size or not b.size:
        return False
    return a.ptr < b.ptr + b.nbytes and b.ptr < a.ptr + a.nbytes
