"""A numpy-backed stand-in for the parts of cupy that aioccl's GPU path uses (tests only; see README).

Device memory is host memory, but every access to its contents is GPU work: enqueued on the current
stream and run late (``cuda/_gpu.py``), so a host program sees only what its streams have done. Views,
shapes and pointers are immediate, as in cupy. New memory is poisoned (0x5A bytes): a read that comes
before the write meant for it sees the poison.
"""

from __future__ import annotations

import ctypes
from typing import Any

import ml_dtypes
import numpy as np

from . import cuda
from .cuda import _bridge

__version__ = "0-fake"


class _Dev:
    id = 0


class ndarray:  # noqa: N801 - cupy's name
    def __init__(self, shape: Any = None, dtype: Any = float, memptr: Any = None, *, _arr: Any = None,
                 _keep: Any = None) -> None:
        # what keeps the memory alive: an array made over someone else's memory (``memptr``: an
        # UnownedMemory and its owner) holds it, as cupy's does; without this, a buffer viewed through
        # __cuda_array_interface__ (a bfloat16 wrapper) was freed as soon as the caller dropped the
        # wrapper, while a queued kernel still read it (tests/test_gpu.py's bfloat16 x1500 flake)
        self._keep = memptr if _arr is None else _keep
        if _arr is None:
            dt = np.dtype(dtype)
            shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
            n = int(np.prod(shape)) * dt.itemsize
            if memptr is None or n == 0:
                _arr = np.full(n, 0x5A, np.uint8).view(dt).reshape(shape)  # fresh memory: poisoned
                cuda._gpu.GPU.keep(_arr)
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
        return ndarray(_arr=self._a.reshape(*shape), _keep=self._keep)

    def view(self, dtype: Any) -> ndarray:
        return ndarray(_arr=self._a.view(dtype), _keep=self._keep)

    def __getitem__(self, key: Any) -> ndarray:
        return ndarray(_arr=self._a[key], _keep=self._keep)

    def __setitem__(self, key: Any, value: Any) -> None:
        dst = self._a
        src = value._a if isinstance(value, ndarray) else value

        def copy() -> None:
            dst[key] = src

        cuda.enqueue(copy)

    def get(self, stream: Any = None) -> np.ndarray:
        """A device-to-host copy on the current stream; the host waits for it (as cupy's blocking get)."""
        host = np.empty_like(self._a)
        src = self._a
        s = stream if stream is not None else cuda.get_current_stream()

        def copy() -> None:
            host[...] = src

        cuda.enqueue(copy, s)
        s.synchronize()
        return host

    def set(self, arr: np.ndarray, stream: Any = None) -> None:
        """A host-to-device copy of ``arr`` as it is now, landing when the stream gets there."""
        if arr.shape != self._a.shape:
            raise ValueError("Shape mismatch")
        snapshot = np.array(arr, dtype=self._a.dtype, copy=True)
        dst = self._a

        def copy() -> None:
            dst[...] = snapshot

        cuda.enqueue(copy, stream)

    def __len__(self) -> int:
        return len(self._a)


def asarray(x: Any, dtype: Any = None) -> ndarray:
    if isinstance(x, ndarray):
        return x
    if hasattr(x, "__cuda_array_interface__"):  # zero-copy, as cupy does
        cai = x.__cuda_array_interface__
        mem = cuda.UnownedMemory(cai["data"][0], 0, x)
        return ndarray(tuple(cai["shape"]), np.dtype(cai["typestr"]), cuda.MemoryPointer(mem, 0))
    host = np.asarray(x, dtype=dtype)
    out = empty(host.shape, host.dtype)
    out.set(host)  # as cupy does: staged, then copied on the current stream
    return out


def asnumpy(x: ndarray, stream: Any = None) -> np.ndarray:
    return x.get(stream)


def empty(shape: Any, dtype: Any = float) -> ndarray:  # poisoned, so nothing passes by luck
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (int(shape),)
    raw = np.full(int(np.prod(shape)) * np.dtype(dtype).itemsize, 0x5A, np.uint8)
    cuda._gpu.GPU.keep(raw)
    return ndarray(_arr=raw.view(dtype).reshape(shape))


def zeros(shape: Any, dtype: Any = float) -> ndarray:
    out = empty(shape, dtype)
    out[...] = 0  # a memset on the current stream
    return out


def from_dlpack(x: Any) -> ndarray:
    return ndarray(_arr=np.from_dlpack(x))




class RawModule:
    """aioccl's piece kernels (``kernels/gpu_piece.py``), run by name with ``aioccl.gpu.piece.emulate`` (the small
    all_reduce's with ``emulate_small``): the
    kernel's meaning in numpy, flags, deadline and error word included (its CUDA source is compiled with NVRTC
    in ``tests/test_gpu_piece_kernel.py``)."""

    def __init__(self, code: str = "", options: Any = (), **kw: Any) -> None:
        self.code = code

    def get_function(self, name: str) -> _PieceKernel:
        return _PieceKernel(name)


class _Function:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class _PieceKernel:
    def __init__(self, name: str) -> None:
        from aioccl.dtypes import ReduceOp

        parts = name.split("_", 3)  # aioccl, piece or small, op, dtype
        assert parts[0] == "aioccl" and parts[1] in ("piece", "small"), name
        from aioccl.gpu.piece import emulate, emulate_small

        self.emulate = emulate_small if parts[1] == "small" else emulate
        self.op = ReduceOp(parts[2])
        self.dt = np.dtype(ml_dtypes.bfloat16) if parts[3] == "bfloat16" else np.dtype(parts[3])
        if _bridge.active():  # a driver function, so aioccl's native GPU lane launches it (cuda/_bridge.py)
            self.kernel = _Function(_bridge.new_id())
            _bridge.KERNELS[self.kernel.ptr] = self

    def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...], **kw: Any) -> None:
        """Launched on the current stream: it runs when the stream gets there."""
        vals = [float(a) if isinstance(a, (float, np.floating)) else int(a) for a in args]
        cuda.enqueue(lambda: self.emulate(self.dt, self.op, int(grid[0]), *vals))  # type: ignore[arg-type]
