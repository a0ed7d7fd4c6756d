"""Scratch memory, allocated once and reused.

Schedules need scratch (incoming chunks before a reduction, partial sums) and
early messages need somewhere to land before their receive is posted. Both
come from this pool in power-of-two size classes, so steady-state traffic
allocates nothing: a buffer freed by one op is the next op's scratch.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

MIN_CLASS = 4096


def size_class(nbytes: int) -> int:
    return max(MIN_CLASS, 1 << (max(1, nbytes) - 1).bit_length())


class BufferPool:
    def __init__(self) -> None:
        self._free: dict[int, list[np.ndarray]] = {}
        self.allocated_bytes = 0  # total ever allocated (a flat line in steady state)
        self.on_new: Callable[[np.ndarray], object] | None = None  # e.g. register it with the RDMA port, once

    def acquire(self, nbytes: int) -> np.ndarray:
        """A uint8 array of at least ``nbytes`` (its ``base`` size is the class)."""
        cls = size_class(nbytes)
        free = self._free.get(cls)
        if free:
            return free.pop()
        self.allocated_bytes += cls
        buf = np.empty(cls, dtype=np.uint8)
        if self.on_new is not None:
            self.on_new(buf)
        return buf

    def release(self, buf: np.ndarray) -> None:
        self._free.setdefault(buf.size, []).append(buf)
