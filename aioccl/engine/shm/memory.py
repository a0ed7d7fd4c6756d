"""What a shared-memory channel maps: every rank's segment, as the words and arrays the executor uses.

The shared words (step counters, sleeping flags, op descriptors), the slot
halves and registered buffers of each rank, and the views the executor
slices. ``ShmChannel`` adds to it the running of ops: the queue, waiting,
deadlines and failure. Nothing here waits or knows of the event loop.
"""

from __future__ import annotations

import ctypes
import struct
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...transport.shm.fifo import fence
from ...transport.shm.heap import Heap
from ...transport.shm.segment import CONTROL_BYTES, CTR, DESC, DESC_LEN, HALF, HEAP, HEAP_OFF, SLEEP, LoopBell, Segment
from ..op import Wait

_DESC = struct.Struct("<8q")
_DESC_AT = (DESC * 8, (DESC + DESC_LEN) * 8)  # byte offset of each slot half's descriptor


class ChannelMemory:
    def __init__(self, rank: int, segments: Sequence[Segment], bell: LoopBell,
                 world: tuple[int, ...] | None = None, readers: list[Any] | None = None) -> None:
        self.rank = rank
        self.size = len(segments)
        self.world = world if world is not None else tuple(range(self.size))  # channel rank -> world rank
        self.others = tuple(j for j in range(self.size) if j != rank)
        self.segments = list(segments)
        self.readers = readers  # a PeerMemory per peer: the channel may read peers' buffers in place
        self._mms = [seg.mm for seg in segments]
        self.bell = bell
        self.ctl = [memoryview(s.mm)[:CONTROL_BYTES].cast("q") for s in segments]
        self.u8 = [np.frombuffer(s.mm, dtype=np.uint8) for s in segments]
        self.slot_base = [(CONTROL_BYTES, CONTROL_BYTES + c[HALF]) for c in self.ctl]
        self.cap_bytes = min(c[HALF] for c in self.ctl)  # every rank chunks by the same amount
        me = self.ctl[rank]
        self.heap = Heap(me[HEAP_OFF], me[HEAP])
        self._seg_addr = self.u8[rank].__array_interface__["data"][0]
        self.all_reached = me[CTR]
        self._spill: np.ndarray | None = None
        self._typed: dict[tuple[int, np.dtype[Any]], np.ndarray] = {}
        self.stats = {"ops": 0, "spin_hits": 0, "parks": 0, "bells_rung": 0, "recheck_hits": 0, "cma_reads": 0,
                      "cma_writes": 0}

    # -- the shared words -------------------------------------------------
    @property
    def step(self) -> int:
        """The last step this rank published: its counter itself, which the native core advances too (so a
        signal between the core and Python never leaves a stale copy)."""
        return int(self.ctl[self.rank][CTR])

    def publish(self, s: int) -> None:
        ctl = self.ctl
        ctl[self.rank][CTR] = s
        fence()
        for j in self.others:
            if ctl[j][SLEEP]:
                self.bell.ring(self.world[j])
                self.stats["bells_rung"] += 1

    def write_descriptor(self, half: int, desc: tuple[int, ...]) -> None:
        _DESC.pack_into(self._mms[self.rank], _DESC_AT[half], *desc)

    def read_descriptors(self, half: int, mine: tuple[int, ...]) -> list[tuple[int, ...]]:
        off, unpack = _DESC_AT[half], _DESC.unpack_from
        descs = [unpack(mm, off) for mm in self._mms]
        descs[self.rank] = mine
        return descs

    def missing(self, ranks: tuple[int, ...], s: int) -> list[int]:
        ctl = self.ctl
        return [j for j in ranks if ctl[j][CTR] < s]

    def reached(self, wait: Wait) -> bool:
        ranks, s = wait
        ctl = self.ctl
        for j in ranks:
            if ctl[j][CTR] < s:
                return False
        if len(ranks) == len(self.others) and s > self.all_reached:
            self.all_reached = s
        return True

    # -- registered buffers ---------------------------------------------------
    def heap_offset(self, arr: np.ndarray) -> int:
        """Byte offset of ``arr`` in my segment when it lies in my heap, else -1."""
        if not arr.size or not self.heap.used_blocks():
            return -1
        off = arr.__array_interface__["data"][0] - self._seg_addr
        heap = self.heap
        return off if heap.offset <= off and off + arr.nbytes <= heap.offset + heap.size else -1

    def alloc(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        off = self.heap.alloc(nbytes)
        owner = (ctypes.c_char * max(1, nbytes)).from_buffer(self.segments[self.rank].mm, off)
        weakref.finalize(owner, self.heap.free, off)
        return np.frombuffer(memoryview(owner), dtype=dtype, count=int(np.prod(shape, dtype=np.int64))).reshape(shape)

    def typed(self, j: int, dtype: np.dtype[Any]) -> np.ndarray:
        """Rank ``j``'s whole segment as an array of ``dtype`` (cached: slicing it is one numpy call)."""
        arr = self._typed.get((j, dtype))
        if arr is None:
            u8 = self.u8[j]
            arr = self._typed[(j, dtype)] = u8[:u8.size // dtype.itemsize * dtype.itemsize].view(dtype)
        return arr

    def spill(self, nbytes: int) -> np.ndarray:
        if self._spill is None or self._spill.nbytes < nbytes:
            self._spill = np.empty(max(nbytes, self.cap_bytes), dtype=np.uint8)
        return self._spill

    def unmap(self) -> None:
        for c in self.ctl:
            c.release()
        self.u8 = []
        self._mms = []
        self._typed.clear()
        self._spill = None
        for seg in self.segments:
            seg.close()
