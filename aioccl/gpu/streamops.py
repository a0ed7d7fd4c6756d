"""Stream memory operations: a 32-bit write or wait on device memory, ordered on a stream, no kernel.

``cuStreamWaitValue32`` holds a stream until a word reaches a value; the
GPU does the waiting without running anything, so two processes that are
time-sliced on one GPU (no MPS) can hand an op over in microseconds where a
kernel spinning on the other's flag waits for a whole time slice. cupy does
not wrap these driver calls; they are reached through ``libcuda`` with
ctypes (a stand-in cupy may provide ``cupy.cuda.driver.streamWaitValue32``
and ``streamWriteValue32`` itself, which then win).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

from .launch import driver_library

WAIT_GEQ = 0x0  # CU_STREAM_WAIT_VALUE_GEQ: (int32_t)(*addr - value) >= 0, so a wrapped counter still works
Op = Callable[[int, int, int], None]  # (stream handle, device address, value)


def load(cp: Any) -> tuple[Op, Op]:
    """(write, wait_geq) for streams of ``cp``'s current device."""
    drv = getattr(cp.cuda, "driver", None)
    write = getattr(drv, "streamWriteValue32", None)
    wait = getattr(drv, "streamWaitValue32", None)
    if write is not None and wait is not None:
        return (lambda s, p, v: write(s, p, v, 0)), (lambda s, p, v: wait(s, p, v, WAIT_GEQ))
    lib = ctypes.CDLL(driver_library())
    fns = []
    for name in ("cuStreamWriteValue32", "cuStreamWaitValue32"):
        fn = getattr(lib, name + "_v2", None) or getattr(lib, name)
        fn.argtypes = (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint)
        fn.restype = ctypes.c_int
        fns.append(fn)
    cu_write, cu_wait = fns

    def checked(fn: Any, what: str, flags: int) -> Op:
        def call(stream: int, ptr: int, value: int) -> None:
            rc = fn(stream, ptr, value & 0xFFFFFFFF, flags)
            if rc != 0:
                raise RuntimeError(f"{what} failed: CUresult {rc}")
        return call

    return checked(cu_write, "cuStreamWriteValue32", 0), checked(cu_wait, "cuStreamWaitValue32", WAIT_GEQ)
