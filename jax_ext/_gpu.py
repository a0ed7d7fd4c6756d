"""The host callback's GPU side: XLA's device buffers as cupy views, ops ordered on XLA's stream.

On GPU, XLA hands the callback device buffers (``__cuda_array_interface__``)
and its CUDA stream (``ctx.stream``). The callback views the buffers
zero-copy, makes XLA's stream the current cupy stream while it issues the op,
so the op reads its input after the kernels that produced it and enqueues
its results (copies and reduction kernels) on that stream, and waits for the
op's host phase. XLA's later kernels on the stream then see the results; no
device-wide synchronization is involved.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np

from aioccl.gpu.probe import load_cupy

BF16 = np.dtype(ml_dtypes.bfloat16)
D2H = 2


class Bf16View:
    """An XLA bfloat16 buffer (cupy has no bfloat16): aioccl reads its dtype; ``[...] = 0`` clears it."""

    dtype = BF16

    def __init__(self, cp: Any, buf: Any) -> None:
        self._cai = buf.__cuda_array_interface__
        self.shape = tuple(self._cai["shape"])
        self._cp = cp

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return dict(self._cai)

    def __setitem__(self, key: Any, value: Any) -> None:
        storage = self._cp.asarray(_Retyped(self._cai, "<u2"))
        storage[key] = value  # only zero is ever written, whose bits are the same in uint16


class _Retyped:
    def __init__(self, cai: dict[str, Any], typestr: str) -> None:
        self.__cuda_array_interface__ = {**cai, "typestr": typestr}


def view(cp: Any, buf: Any) -> Any:
    """A zero-copy view of an XLA GPU buffer: a cupy array, or ``Bf16View`` for bfloat16."""
    if np.dtype(buf.dtype) == BF16:
        return Bf16View(cp, buf)
    return cp.asarray(buf)


def address(x: Any) -> int:
    return int(x.__cuda_array_interface__["data"][0])


@contextlib.contextmanager
def on_stream(ptr: int) -> Iterator[tuple[Any, Any]]:
    """``(cupy, stream)`` with XLA's stream current on this thread for the duration."""
    cp = load_cupy("jax_ext on GPU")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        stream = cp.cuda.ExternalStream(int(ptr))
    with stream:
        yield cp, stream


def read_scalar(cp: Any, stream: Any, buf: Any) -> int:
    """The mesh-position operand (a device int32) on the host, after the kernels that computed it."""
    return read_scalar_at(cp, stream, address(buf))


def read_scalar_at(cp: Any, stream: Any, where: int) -> int:
    """The device int32 at address ``where`` on the host, after the kernels on ``stream`` before it."""
    host = np.empty(1, dtype=np.int32)
    cp.cuda.runtime.memcpyAsync(host.ctypes.data, where, 4, D2H, stream.ptr)
    stream.synchronize()
    return int(host[0])
