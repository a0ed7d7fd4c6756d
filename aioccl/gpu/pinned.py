"""Page-locked host buffers for the staged path, reused for the communicator's life.

Device-to-host copies run asynchronously (and at full PCIe speed) only from
pinned memory, and pinning is slow (milliseconds per call), so buffers are
allocated once per size class and recycled. An op takes its buffers at call
time and gives them back with the CUDA event after which the GPU no longer
touches them; a buffer is reused only once that event has completed, so
giving back never waits for the GPU.

The caller's thread takes blocks (an op's input is staged at call time) while
the engine's thread takes and gives back others, so every method holds the
pool's lock: without it, one block could reach the free list twice and two
ops would stage through the same bytes.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

MIN_CLASS = 1 << 12


@dataclass(slots=True)
class Block:
    ptr: int
    nbytes: int  # the size class: a power of two

    def view(self, dtype: np.dtype, count: int) -> np.ndarray:
        """The first ``count`` elements of ``dtype`` as a numpy array (zero-copy)."""
        dt = np.dtype(dtype)
        if count * dt.itemsize > self.nbytes:
            raise ValueError(f"{count} x {dt.name} does not fit a {self.nbytes}-byte block")
        if count == 0:
            return np.empty(0, dtype=dt)
        raw = (ctypes.c_char * (count * dt.itemsize)).from_address(self.ptr)
        return np.frombuffer(memoryview(raw), dtype=dt, count=count)


def size_class(nbytes: int) -> int:
    return max(MIN_CLASS, 1 << max(0, nbytes - 1).bit_length())


class PinnedPool:
    """``take(n)`` a block of at least n bytes; ``give_back(block, event)`` when the GPU is done with it."""

    def __init__(self, alloc: Callable[[int], int], free: Callable[[int], None]) -> None:
        self._alloc, self._free_fn = alloc, free
        self._free: dict[int, list[Block]] = {}
        self._busy: list[tuple[Block, Any]] = []  # (block, event or None): back once event.done
        self._all: list[Block] = []
        self._lock = threading.Lock()

    @property
    def held_bytes(self) -> int:
        with self._lock:
            return sum(b.nbytes for b in self._all)

    def take(self, nbytes: int) -> Block:
        cls = size_class(nbytes)
        with self._lock:
            free = self._free.get(cls)
            if not free:
                self._reclaim()
                free = self._free.get(cls)
            if free:
                return free.pop()
            block = Block(self._alloc(cls), cls)
            self._all.append(block)
            return block

    def give_back(self, block: Block, event: Any = None) -> None:
        with self._lock:
            self._busy.append((block, event))

    def _reclaim(self) -> None:
        still = []
        for block, event in self._busy:
            if event is None or event.done:
                self._free.setdefault(block.nbytes, []).append(block)
            else:
                still.append((block, event))
        self._busy = still

    def close(self) -> None:
        """Free every block (the caller makes sure the GPU is done with them)."""
        with self._lock:
            for block in self._all:
                self._free_fn(block.ptr)
            self._all, self._free, self._busy = [], {}, []
