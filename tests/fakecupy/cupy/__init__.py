"""A numpy-backed stand-in for the parts of cupy that aioccl's GPU path uses (tests only; see README)."""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import ml_dtypes
import numpy as np

from . import cuda

__version__ = "0-fake"


class _Dev:
    id = 0


class ndarray:  # noqa: N801 - cupy's name
    def __init__(self, shape: Any = None, dtype: Any = float, memptr: Any = None, *, _arr: Any = None) -> None:
        if _arr is None:
            dt = np.dtype(dtype)
            shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
            n = int(np.prod(shape)) * dt.itemsize
            if memptr is None or n == 0:
                _arr = np.zeros(shape, dt)
            else:
                raw = (ctypes.c_char * n).from_address(memptr.ptr)
                _arr = np.frombuffer(raw, dtype=dt).reshape(shape)
        self._a = _arr

    data = property(lambda self: cuda.MemoryPointer(cuda.UnownedMemory(self._a.ctypes.data, self._a.nbytes, self), 0))
    device = property(lambda self: _Dev())
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    flags = property(lambda self: self._a.flags)
    strides = property(lambda self: self._a.strides)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self._a.shape, "typestr": self._a.dtype.str, "data": (self._a.ctypes.data, False),
                "strides": None if self._a.flags.c_contiguous else self._a.strides, "version": 3}

    def reshape(self, *shape: Any) -> ndarray:
        return ndarray(_arr=self._a.reshape(*shape))

    def view(self, dtype: Any) -> ndarray:
        return ndarray(_arr=self._a.view(dtype))

    def __getitem__(self, key: Any) -> ndarray:
        return ndarray(_arr=self._a[key])

    def __setitem__(self, key: Any, value: Any) -> None:
        self._a[key] = value._a if isinstance(value, ndarray) else value

    def get(self) -> np.ndarray:
        return self._a.copy()

    def set(self, arr: np.ndarray) -> None:
        if arr.shape != self._a.shape:
            raise ValueError("Shape mismatch")
        self._a[...] = arr

    def __len__(self) -> int:
        return len(self._a)


def asarray(x: Any, dtype: Any = None) -> ndarray:
    if isinstance(x, ndarray):
        return x
    if hasattr(x, "__cuda_array_interface__"):  # zero-copy, as cupy does
        cai = x.__cuda_array_interface__
        mem = cuda.UnownedMemory(cai["data"][0], 0, x)
        return ndarray(tuple(cai["shape"]), np.dtype(cai["typestr"]), cuda.MemoryPointer(mem, 0))
    return ndarray(_arr=np.array(x, dtype=dtype))


def asnumpy(x: ndarray) -> np.ndarray:
    return x.get()


def empty(shape: Any, dtype: Any = float) -> ndarray:  # poisoned, so nothing passes by luck
    return ndarray(_arr=np.full(shape, 0x5A, np.uint8).repeat(np.dtype(dtype).itemsize).view(dtype).reshape(shape)
                   if np.prod(shape) else np.empty(shape, dtype))


def zeros(shape: Any, dtype: Any = float) -> ndarray:
    return ndarray(_arr=np.zeros(shape, dtype))


def from_dlpack(x: Any) -> ndarray:
    return ndarray(_arr=np.from_dlpack(x))


_kernel_lock = threading.Lock()


class ElementwiseKernel:
    """Runs aioccl's kernels by name with numpy (their CUDA source is tested with gcc)."""

    def __init__(self, in_params: str, out_params: str, operation: str, name: str, **kw: Any) -> None:
        self.name = name
        self.operation = operation

    def __call__(self, *args: Any) -> None:
        from aioccl.dtypes import ReduceOp
        from aioccl.kernels import cpu

        parts = self.name.split("_", 2)  # aioccl, op or "scale", dtype
        dt = np.dtype(ml_dtypes.bfloat16) if parts[2] == "bfloat16" else np.dtype(parts[2])
        if parts[1] == "scale":
            n, c = args
            cpu.scale(ReduceOp.AVG, c._a.view(dt), int(n))
            return
        a, b, c = args
        cpu.combine(ReduceOp(parts[1]), c._a.view(dt), a._a.view(dt), b._a.view(dt))
