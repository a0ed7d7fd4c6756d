"""Which CUDA stream an op is ordered on.

An op on GPU buffers reads its input after the work already queued on the
caller's *current* cupy stream (or the ``stream=`` argument) and puts its
results on that stream. ``stream=`` takes what users hold: a cupy stream, a
raw ``cudaStream_t`` as an int (XLA's ``ctx.stream``), a torch stream, or
anything with the ``__cuda_stream__`` protocol.
"""

from __future__ import annotations

import warnings
from typing import Any

from ..errors import InvalidArgument


def resolve(cp: Any, stream: Any) -> Any:
    """A cupy stream object for ``stream`` (None: the current one)."""
    if stream is None:
        return cp.cuda.get_current_stream()
    if isinstance(stream, (cp.cuda.Stream, cp.cuda.ExternalStream)):
        return stream
    ptr: Any = None
    if isinstance(stream, int):
        ptr = stream
    elif hasattr(stream, "__cuda_stream__"):
        ptr = stream.__cuda_stream__()[1]
    elif hasattr(stream, "cuda_stream"):  # torch.cuda.Stream
        ptr = stream.cuda_stream
    if not isinstance(ptr, int):
        raise InvalidArgument(f"stream must be a cupy stream, a cudaStream_t int, or have __cuda_stream__; "
                              f"got {type(stream).__name__}")
    with warnings.catch_warnings():  # cupy 14 deprecates ExternalStream for Stream.from_external(protocol)
        warnings.simplefilter("ignore", DeprecationWarning)
        return cp.cuda.ExternalStream(ptr)

