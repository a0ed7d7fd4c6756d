"""cupy.cuda.driver stand-in: the stream memory operations ``aioccl/gpu/streamops.py`` uses (real cupy has
none, so aioccl reaches libcuda itself; here they are GPU work on the stand-in's streams, tests only)."""

from __future__ import annotations

import ctypes

from . import _gpu


def _word(ptr: int) -> ctypes.c_uint32:
    return ctypes.c_uint32.from_address(ptr)


def streamWriteValue32(stream: int, ptr: int, value: int, flags: int) -> None:  # noqa: N802
    def write() -> None:
        _word(ptr).value = value & 0xFFFFFFFF

    _gpu.GPU.submit(int(stream), write)


def streamWaitValue32(stream: int, ptr: int, value: int, flags: int) -> None:  # noqa: N802
    """GEQ, as CUDA compares: ``(int32_t)(*ptr - value) >= 0``. The stream holds there; others run on."""
    _gpu.GPU.submit(int(stream), None, until=lambda: ((_word(ptr).value - value) & 0xFFFFFFFF) < 1 << 31)


def ctxGetCurrent() -> int:  # noqa: N802
    """The one context there is (what tests/native/bridge_cuda.c's cuCtxGetCurrent answers too)."""
    return 0xC0
