"""CUDA IPC bookkeeping: what a rank publishes about its scratch, and the peers' scratch it has opened.

Each rank allocates one scratch buffer with ``cudaMalloc`` directly, outside
cupy's memory pool: an IPC handle names a whole allocation, and a pool
block would expose its neighbours and move under reuse. The handle is
exchanged once per communicator and opened once per peer; the mappings are
cached for the communicator's life and closed with it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)
_EXPORT = struct.Struct(f"<{HANDLE_BYTES}sQqi4x")  # handle, scratch bytes, pid, device ordinal
EXPORT_BYTES = _EXPORT.size


@dataclass(frozen=True, slots=True)
class Export:
    handle: bytes
    nbytes: int
    pid: int
    device: int

    def encode(self) -> bytes:
        return _EXPORT.pack(self.handle, self.nbytes, self.pid, self.device)

    @classmethod
    def decode(cls, raw: bytes) -> Export:
        if len(raw) != EXPORT_BYTES:
            raise ValueError(f"an IPC export is {EXPORT_BYTES} bytes, got {len(raw)}")
        return cls(*_EXPORT.unpack(raw))


class IpcTable:
    """The peers' scratch buffers as mapped into this process: ``ptr(rank)``.

    ``open_fn(handle) -> ptr`` and ``close_fn(ptr)`` are the CUDA runtime's
    (``cudaIpcOpenMemHandle`` / ``cudaIpcCloseMemHandle``); tests pass fakes.
    The same handle is never opened twice (CUDA refuses a second open in one
    process), and this rank's own scratch is used directly.
    """

    def __init__(self, rank: int, own_ptr: int, open_fn: Callable[[bytes], int],
                 close_fn: Callable[[int], None]) -> None:
        self._rank = rank
        self._own = own_ptr
        self._open_fn, self._close_fn = open_fn, close_fn
        self._by_handle: dict[bytes, int] = {}
        self._ptrs: dict[int, int] = {rank: own_ptr}
        self.nbytes: dict[int, int] = {}

    def add(self, rank: int, export: Export) -> int:
        self.nbytes[rank] = export.nbytes
        if rank == self._rank:
            return self._own
        ptr = self._by_handle.get(export.handle)
        if ptr is None:
            ptr = self._by_handle[export.handle] = self._open_fn(export.handle)
        self._ptrs[rank] = ptr
        return ptr

    def ptr(self, rank: int) -> int:
        return self._ptrs[rank]

    @property
    def opened(self) -> int:
        return len(self._by_handle)

    def close(self) -> list[BaseException]:
        """Unmap every peer's scratch; returns the errors instead of raising (close must finish)."""
        errors: list[BaseException] = []
        for ptr in self._by_handle.values():
            try:
                self._close_fn(ptr)
            except Exception as e:  # noqa: BLE001
                errors.append(e)
        self._by_handle.clear()
        self._ptrs = {self._rank: self._own}
        return errors
