"""The GPU path's op record: the engine's ``Op`` and what a GPU op adds (its stream, staged input, blocks)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..algorithms.table import BY_NAME
from ..buffers import Buf
from ..dtypes import ReduceOp, dtype_code
from ..engine.op import Op
from ..work import Work
from .pinned import Block


class GpuOp(Op[Buf]):
    """The one op record (``engine.op.Op``: seq, fingerprint, deadline, Work) and what the GPU path adds: the
    device and stream the op is ordered on, its input staged in pinned memory (one D2H event per piece), and
    the pinned blocks it holds until its results are copied back. Its sequence number is its ticket."""

    __slots__ = ("device", "stream", "staged_in", "blocks", "deferred", "ticket")

    def __init__(self, name: str, ticket: int, count: int, root: int, inp: Buf, out: Buf, op: ReduceOp | None,
                 device: int, stream: Any, timeout: float, work: Work[Any], result: Callable[[], Any]) -> None:
        row = BY_NAME.get(name)  # None for "send" / "recv"
        super().__init__(name, row.code if row is not None else 0, ticket, inp, out, dtype_code(out.array.dtype),
                         op, count, root, timeout, work, result)
        self.device = device
        self.stream = stream
        self.staged_in: tuple[Block, list[Any]] | None = None
        self.blocks: list[Block] = []
        self.ticket = -1  # its turn among the ops with a host phase (runner.py); -1: it has none
        self.deferred = False  # an IPC op enqueued by the engine once the device path is set up
