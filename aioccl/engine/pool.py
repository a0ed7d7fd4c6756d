"""Scratch memory, allocated once and reused.

Schedules need scratch (incoming chunks before a reduction, partial sums) and
early messages need somewhere to land before their receive is posted. Both
come from this pool in power-of-two size classes, so steady-state traffic
allocates nothing: a buffer freed by one op is the next op's scratch.

After a burst (hundreds of unexpected messages, say) the pool gives memory
back: each size class always keeps one idle buffer, and more only while the
idle total stays under ``IDLE_CAP``; the rest go to the allocator (large
numpy arrays are their own mappings, so the memory returns to the system).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

MIN_CLASS = 4096
IDLE_CAP = 64 << 20


def size_class(nbytes: int) -> int:
    return max(MIN_CLASS, 1 << (max(1, nbytes) - 1).bit_length())


class BufferPool:
    def __init__(self, idle_cap: int = IDLE_CAP) -> None:
        self._free: dict[int, list[np.ndarray]] = {}
        self.idle_cap = idle_cap
        self.idle_bytes = 0  # held in _free
        self.allocated_bytes = 0  # total ever allocated (a flat line in steady state)
        self.dropped_bytes = 0  # given back after bursts
        self.on_new: Callable[[np.ndarray], object] | None = None  # e.g. register it with the RDMA port, once
        self.on_drop: Callable[[Any], object] | None = None  # undoes on_new's registration
        self._handles: dict[int, object] = {}  # id(buffer) -> what on_new returned

    def acquire(self, nbytes: int) -> np.ndarray:
        """A uint8 array of at least ``nbytes`` (its ``base`` size is the class)."""
        cls = size_class(nbytes)
        free = self._free.get(cls)
        if free:
            self.idle_bytes -= cls
            return free.pop()
        self.allocated_bytes += cls
        buf = np.empty(cls, dtype=np.uint8)
        if self.on_new is not None:
            handle = self.on_new(buf)
            if handle is not None:
                self._handles[id(buf)] = handle
        return buf

    def release(self, buf: np.ndarray) -> None:
        free = self._free.setdefault(buf.size, [])
        if free and self.idle_bytes + buf.size > self.idle_cap:
            self.dropped_bytes += buf.size
            handle = self._handles.pop(id(buf), None)
            if handle is not None and self.on_drop is not None:
                self.on_drop(handle)
            return
        free.append(buf)
        self.idle_bytes += buf.size
