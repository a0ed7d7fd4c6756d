"""cupy.cuda stand-in: devices, streams, events, raw memory (tests only)."""

from __future__ import annotations

import threading
from typing import Any

from . import runtime

_local = threading.local()


class Device:
    def __init__(self, device: int = 0) -> None:
        self.id = int(device)

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


class Stream:
    _next = 1

    def __init__(self, non_blocking: bool = False) -> None:
        self.ptr = Stream._next
        Stream._next += 1

    def __enter__(self) -> Stream:
        stack = getattr(_local, "stack", None)
        if stack is None:
            stack = _local.stack = []
        stack.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _local.stack.pop()

    def synchronize(self) -> None:
        pass


class ExternalStream(Stream):
    def __init__(self, ptr: int, device_id: int = -1) -> None:
        self.ptr = ptr


Stream.null = ExternalStream(0)


def get_current_stream() -> Stream:
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else Stream.null


class Event:
    """Copies and kernels here run synchronously, so an event is done once recorded."""

    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False) -> None:
        self.recorded_on: Any = None

    def record(self, stream: Any = None) -> None:
        self.recorded_on = stream if stream is not None else get_current_stream()

    @property
    def done(self) -> bool:
        return self.recorded_on is not None

    def synchronize(self) -> None:
        pass


class UnownedMemory:
    def __init__(self, ptr: int, size: int, owner: Any, device_id: int = -1) -> None:
        self.ptr, self.size, self.owner = int(ptr), int(size), owner


class MemoryPointer:
    def __init__(self, mem: UnownedMemory, offset: int) -> None:
        self.mem = mem
        self.ptr = mem.ptr + offset


__all__ = ["Device", "Event", "ExternalStream", "MemoryPointer", "Stream", "UnownedMemory", "get_current_stream",
           "runtime"]
