"""One kernel launch with its arguments packed once, launched through ``cuLaunchKernel``.

cupy's kernel call converts every argument again at each launch (about
1.5 us per numpy scalar): with the piece kernel's 21 arguments that was
most of an 8-byte op's host time. A ``Launch`` keeps its arguments as ctypes
objects and the array of their addresses that ``cuLaunchKernel`` takes, so a
launch is one foreign call; the epoch, the one argument that changes between
launches of the same call, is set in place. A kernel without a driver
function (the test stand-in's) is called the cupy way instead.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np

_CTYPES = {np.dtype(np.uint64): ctypes.c_uint64, np.dtype(np.int64): ctypes.c_int64,
           np.dtype(np.float64): ctypes.c_double, np.dtype(np.int32): ctypes.c_int32,
           np.dtype(np.uint32): ctypes.c_uint32}
_driver: Any = None


def driver_library() -> str:
    """The CUDA driver library aioccl calls directly: ``AIOCCL_CUDA_DRIVER``, else ``libcuda.so.1``."""
    return os.environ.get("AIOCCL_CUDA_DRIVER") or "libcuda.so.1"


def _launch_kernel() -> Any:
    global _driver
    if _driver is None:
        fn = ctypes.CDLL(driver_library()).cuLaunchKernel
        fn.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        fn.restype = ctypes.c_int
        _driver = fn
    return _driver


class Launch:
    """``kern`` on ``grid`` x ``threads`` with ``args`` (numpy scalars); ``epoch_at``: the argument that
    ``__call__`` may set."""

    __slots__ = ("_kern", "_fn", "grid", "threads", "_args", "_values", "_params", "_epoch", "epoch_at")

    def __init__(self, kern: Any, grid: int, threads: int, args: tuple[Any, ...], epoch_at: int) -> None:
        self._kern, self.grid, self.threads, self._args = kern, grid, threads, args
        func = getattr(kern, "kernel", None)  # cupy's RawKernel: its driver function, once compiled
        self._fn = getattr(func, "ptr", None) if func is not None else None
        self._values: list[Any] = [_CTYPES[np.dtype(type(a))](a) for a in args]
        self._params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(v) for v in self._values])
        self._epoch: Any = self._values[epoch_at]
        self.epoch_at = epoch_at

    @property
    def fn(self) -> int | None:
        """The kernel's driver function (None: the test stand-in's kernel, called the cupy way)."""
        return self._fn

    @property
    def values(self) -> list[Any]:
        """The arguments as ctypes values, in order (``gpu/lane.py`` packs them for the native lane)."""
        return self._values

    def __call__(self, stream: Any, epoch: int | None = None) -> None:
        if epoch is not None:
            self._epoch.value = epoch & 0xFFFFFFFF
        if self._fn is None:
            args = self._args
            if epoch is not None:
                args = tuple(np.uint32(self._epoch.value) if v is self._epoch else a
                             for a, v in zip(args, self._values, strict=True))
            with stream:
                self._kern((self.grid,), (self.threads,), args)
            return
        rc = _launch_kernel()(self._fn, self.grid, 1, 1, self.threads, 1, 1, 0, stream.ptr, self._params, None)
        if rc != 0:
            raise RuntimeError(f"cuLaunchKernel failed: CUresult {rc}")
