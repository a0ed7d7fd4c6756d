"""The stand-in's side of ``tests/native/bridge_cuda.c``: with ``FAKECUPY_DRIVER`` naming that library (built),
the driver calls aioccl's native GPU lane makes run here, on the stand-in's late streams (tests only).

aioccl loads the same library as its CUDA driver (``AIOCCL_CUDA_DRIVER``); kernels and events get the
handles it passes back (``KERNELS``, ``EVENTS``), and a launch runs the kernel's numpy meaning
(``aioccl.gpu.piece.emulate``, or ``emulate_small``) from the arguments packed in its parameter array.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import weakref
from typing import Any

from . import _gpu, driver

NOT_READY = 600
# the piece kernel's parameters, in order (kernels/gpu_piece.py): their C types
_ARGS = (ctypes.c_uint64,) * 4 + (ctypes.c_int64,) * 5 + (ctypes.c_uint64, ctypes.c_double) \
    + (ctypes.c_int32,) * 8 + (ctypes.c_uint32, ctypes.c_int32)
_ids = itertools.count(1)
KERNELS: dict[int, Any] = {}
EVENTS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_lib: Any = None
_keep: list[Any] = []  # the callbacks, alive as long as the library may call them


def active() -> bool:
    return _lib is not None


def new_id() -> int:
    return next(_ids)


class _At:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


def _launch(f: int, grid: int, threads: int, stream: int, params: int) -> int:
    kern = KERNELS[f]
    at = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
    vals = [t.from_address(at[k]).value for k, t in enumerate(_ARGS)]
    _gpu.GPU.submit(int(stream or 0), lambda: kern.emulate(kern.dt, kern.op, int(grid), *vals))
    return 0


def _write(stream: int, addr: int, value: int, flags: int) -> int:
    driver.streamWriteValue32(int(stream or 0), addr, value, flags)
    return 0


def _wait(stream: int, addr: int, value: int, flags: int) -> int:
    driver.streamWaitValue32(int(stream or 0), addr, value, flags)
    return 0


def _record(ev: int, stream: int) -> int:
    EVENTS[ev].record(_At(int(stream or 0)))
    return 0


def _query(ev: int) -> int:
    return 0 if EVENTS[ev].done else NOT_READY


def _sync(ev: int) -> int:
    EVENTS[ev].synchronize()
    return 0


def _stream_wait(stream: int, ev: int) -> int:
    at = EVENTS[ev]._at
    if at is not None:
        _gpu.GPU.submit(int(stream or 0), None, deps=[at])
    return 0


def load() -> None:
    global _lib
    path = os.environ.get("FAKECUPY_DRIVER")
    if not path or _lib is not None:
        return
    lib = ctypes.CDLL(path)
    vp, u, ull = ctypes.c_void_p, ctypes.c_uint, ctypes.c_ulonglong
    types = (ctypes.CFUNCTYPE(ctypes.c_int, vp, u, u, vp, vp), ctypes.CFUNCTYPE(ctypes.c_int, vp, ull, u, u),
             ctypes.CFUNCTYPE(ctypes.c_int, vp, ull, u, u), ctypes.CFUNCTYPE(ctypes.c_int, vp, vp),
             ctypes.CFUNCTYPE(ctypes.c_int, vp), ctypes.CFUNCTYPE(ctypes.c_int, vp),
             ctypes.CFUNCTYPE(ctypes.c_int, vp, vp))
    fns = (_launch, _write, _wait, _record, _query, _sync, _stream_wait)
    _keep.extend(t(f) for t, f in zip(types, fns, strict=True))
    lib.bridge_register(*_keep)
    _lib = lib
