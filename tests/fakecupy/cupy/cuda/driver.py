"""cupy.cuda.driver stand-in: the stream memory operations ``aioccl/gpu/streamops.py`` uses (real cupy has
none, so aioccl reaches libcuda itself; here they are GPU work on the stand-in's streams, tests only)."""

from __future__ import annotations

import ctypes
import time

from . import _gpu

WAIT_LIMIT_S = 120.0  # a real stream waits for ever; the stand-in's one worker must not


def _word(ptr: int) -> ctypes.c_uint32:
    return ctypes.c_uint32.from_address(ptr)


def streamWriteValue32(stream: int, ptr: int, value: int, flags: int) -> None:  # noqa: N802
    def write() -> None:
        _word(ptr).value = value & 0xFFFFFFFF

    _gpu.GPU.submit(int(stream), write)


def streamWaitValue32(stream: int, ptr: int, value: int, flags: int) -> None:  # noqa: N802
    """GEQ, as CUDA compares: ``(int32_t)(*ptr - value) >= 0``."""
    def wait() -> None:
        limit = time.monotonic() + WAIT_LIMIT_S
        while ((_word(ptr).value - value) & 0xFFFFFFFF) >= 1 << 31:
            if time.monotonic() > limit:
                raise _gpu.FakeGpuError(f"fakecupy: a stream waited {WAIT_LIMIT_S:.0f}s for a flag")
            time.sleep(0.0001)

    _gpu.GPU.submit(int(stream), wait)
