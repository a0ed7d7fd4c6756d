"""The registered-buffer heap: first-fit allocation inside my segment.

``comm.alloc`` carves arrays out of the heap region of my segment, which every
same-host peer has mapped; collectives on such arrays skip the staging copy
(peers read them where they lie). Blocks are returned when the last numpy
view of an array is garbage collected.
"""

from __future__ import annotations

import threading

ALIGN = 256


class Heap:
    def __init__(self, offset: int, size: int) -> None:
        self.offset, self.size = offset, size
        self._free: list[tuple[int, int]] = [(offset, size)] if size else []  # sorted (start, length)
        self._used: dict[int, int] = {}
        self._lock = threading.Lock()

    def alloc(self, nbytes: int) -> int:
        """Offset of a block of at least ``nbytes`` (aligned); MemoryError when the heap is full."""
        need = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        with self._lock:
            for i, (start, length) in enumerate(self._free):
                if length >= need:
                    if length == need:
                        del self._free[i]
                    else:
                        self._free[i] = (start + need, length - need)
                    self._used[start] = need
                    return start
        raise MemoryError(f"registered-buffer heap exhausted: {nbytes} bytes wanted, {self.free_bytes()} free "
                          f"of {self.size} (raise AIOCCL_SHM_HEAP)")

    def free(self, start: int) -> None:
        with self._lock:
            length = self._used.pop(start)
            free = self._free
            i = 0
            while i < len(free) and free[i][0] < start:
                i += 1
            free.insert(i, (start, length))
            # coalesce with the next, then with the previous block
            if i + 1 < len(free) and free[i][0] + free[i][1] == free[i + 1][0]:
                free[i] = (free[i][0], free[i][1] + free[i + 1][1])
                del free[i + 1]
            if i > 0 and free[i - 1][0] + free[i - 1][1] == free[i][0]:
                free[i - 1] = (free[i - 1][0], free[i - 1][1] + free[i][1])
                del free[i]

    def free_bytes(self) -> int:
        return sum(length for _s, length in self._free)

    def used_blocks(self) -> int:
        return len(self._used)
