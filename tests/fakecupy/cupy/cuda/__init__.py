"""cupy.cuda stand-in: devices, streams, events, raw memory (tests only).

Streams and events are backed by ``_gpu``: work enqueued on a stream runs
late, in stream order, and an event is done only once its stream reached it.
"""

from __future__ import annotations

import threading
from typing import Any

from . import _bridge, _gpu, driver, runtime  # noqa: F401 - cupy.cuda.driver

_local = threading.local()


class Device:
    def __init__(self, device: int = 0) -> None:
        self.id = int(device)

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def synchronize(self) -> None:
        _gpu.GPU.synchronize()


class Stream:
    _next = 0x1000
    _lock = threading.Lock()

    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False) -> None:
        with Stream._lock:
            Stream._next += 0x10
            self.ptr = 0 if null else Stream._next
        q = _gpu.GPU.queue(self.ptr, blocking=not non_blocking)
        q.blocking = self.ptr == 0 or not non_blocking

    def __enter__(self) -> Stream:
        stack = getattr(_local, "stack", None)
        if stack is None:
            stack = _local.stack = []
        stack.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _local.stack.pop()

    def synchronize(self) -> None:
        _gpu.GPU.synchronize_stream(self.ptr)

    @property
    def done(self) -> bool:
        q = _gpu.GPU.queue(self.ptr)
        return _gpu.GPU.done(q, q.last)

    def record(self, event: Event | None = None) -> Event:
        event = event if event is not None else Event()
        event.record(self)
        return event

    def is_capturing(self) -> bool:
        return False

    def wait_event(self, event: Event) -> None:
        """Later work on this stream waits until ``event`` completes (it captured its stream at record time)."""
        if event._at is not None:
            _gpu.GPU.submit(self.ptr, None, deps=[event._at])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other.ptr == self.ptr

    def __hash__(self) -> int:
        return hash(self.ptr)


class ExternalStream(Stream):
    """A stream made elsewhere (XLA's, torch's): the same queue as every other object with this handle."""

    def __init__(self, ptr: int, device_id: int = -1) -> None:
        self.ptr = int(ptr)
        _gpu.GPU.queue(self.ptr)


Stream.null = ExternalStream(0)


def get_current_stream() -> Stream:
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else Stream.null


def enqueue(fn: Any, stream: Stream | None = None) -> None:
    """Run ``fn`` on the GPU, late, after the work already queued on ``stream`` (default: the current one)."""
    _gpu.GPU.submit((stream or get_current_stream()).ptr, fn)


class Event:
    """Done once the stream it was last recorded on has run everything queued before the record."""

    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False) -> None:
        self._at: tuple[Any, int] | None = None
        self.ptr = _bridge.new_id()  # its handle, for the driver bridge (cuda/_bridge.py)
        _bridge.EVENTS[self.ptr] = self

    def record(self, stream: Any = None) -> None:
        s = stream if stream is not None else get_current_stream()
        self._at = _gpu.GPU.submit(s.ptr, None)

    @property
    def done(self) -> bool:
        return self._at is None or _gpu.GPU.done(*self._at)

    def synchronize(self) -> None:
        if self._at is not None:
            _gpu.GPU.wait(*self._at)


class UnownedMemory:
    def __init__(self, ptr: int, size: int, owner: Any, device_id: int = -1) -> None:
        self.ptr, self.size, self.owner = int(ptr), int(size), owner


class MemoryPointer:
    def __init__(self, mem: UnownedMemory, offset: int) -> None:
        self.mem = mem
        self.ptr = mem.ptr + offset


__all__ = ["Device", "Event", "ExternalStream", "MemoryPointer", "Stream", "UnownedMemory", "enqueue",
           "get_current_stream", "runtime"]

_bridge.load()  # FAKECUPY_DRIVER: aioccl's native GPU lane drives these streams through it
