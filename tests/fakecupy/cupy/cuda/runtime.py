"""cupy.cuda.runtime stand-in. Device memory is a file in /dev/shm, so IPC handles really work across
processes; ``memcpyAsync`` runs late on its stream (``_gpu``), and the frees synchronize the device first, as
``cudaFree`` and ``cudaFreeHost`` do (tests only)."""

from __future__ import annotations

import atexit
import ctypes
import mmap
import os
import sys
from typing import Any

from fakecupy_driver import reclaim

from . import _gpu

memcpyDefault = 4  # noqa: N816 - cupy's name
cudaIpcMemLazyEnablePeerAccess = 1  # noqa: N816

_segments: dict[int, int] = {}  # ptr -> size, allocated here (a file in /dev/shm, so peers can map it)
_maps: dict[int, Any] = {}  # ptr -> (mmap, ctypes anchor, path)
_count = 0
_host: dict[int, Any] = {}
stats = {"malloc": 0, "ipc_open": 0, "ipc_close": 0, "host_alloc": 0, "memcpy": 0}


class CUDARuntimeError(RuntimeError):
    pass


def getDeviceCount() -> int:  # noqa: N802
    if os.environ.get("FAKECUPY_NO_DEVICE"):
        raise CUDARuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")
    return 1


def getDeviceProperties(i: int) -> dict[str, Any]:  # noqa: N802
    return {"name": b"fake GPU (numpy, tests/fakecupy)"}


def runtimeGetVersion() -> int:  # noqa: N802
    return 0


def getDevice() -> int:  # noqa: N802
    return 0


class _Attrs:
    device = 0


def pointerGetAttributes(ptr: int) -> _Attrs:  # noqa: N802
    return _Attrs()


def _map(path: str, size: int) -> int:
    fd = os.open(path, os.O_RDWR)
    try:
        mem = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    anchor = ctypes.c_char.from_buffer(mem)  # the mapping stays for the process's life, like a leaked cudaMalloc
    ptr = ctypes.addressof(anchor)
    _maps[ptr] = (mem, anchor, path)
    return ptr


def malloc(size: int) -> int:
    global _count
    _count += 1
    path = f"/dev/shm/fakecupy-{os.getpid()}-{_count}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    ptr = _map(path, size)
    _segments[ptr] = size
    stats["malloc"] += 1
    return ptr


def free(ptr: int) -> None:
    _gpu.GPU.synchronize()
    _segments.pop(ptr)
    os.unlink(_maps[ptr][2])


def ipcGetMemHandle(ptr: int) -> bytes:  # noqa: N802
    path = _maps[ptr][2].encode()
    return (path + b"\0" + _segments[ptr].to_bytes(8, "little")).ljust(64, b"\0")


def ipcOpenMemHandle(handle: bytes, flags: int = 1) -> int:  # noqa: N802
    path, rest = handle.split(b"\0", 1)
    stats["ipc_open"] += 1
    return _map(path.decode(), int.from_bytes(rest[:8], "little"))


def ipcCloseMemHandle(ptr: int) -> None:  # noqa: N802
    stats["ipc_close"] += 1


def hostAlloc(size: int, flags: int) -> int:  # noqa: N802
    buf = ctypes.create_string_buffer(size)
    ptr = ctypes.addressof(buf)
    _host[ptr] = buf
    stats["host_alloc"] += 1
    return ptr


def freeHost(ptr: int) -> None:  # noqa: N802
    _gpu.GPU.synchronize()
    del _host[ptr]


def memcpyAsync(dst: int, src: int, size: int, kind: int, stream: int) -> None:  # noqa: N802
    """Enqueued on ``stream``: the bytes move when the stream gets there, whatever the host did meanwhile."""
    stats["memcpy"] += 1
    _gpu.GPU.submit(int(stream), lambda: ctypes.memmove(dst, src, size))


def memcpy(dst: int, src: int, size: int, kind: int) -> None:
    """On the legacy stream, and the host waits for it."""
    memcpyAsync(dst, src, size, kind, 0)
    _gpu.GPU.synchronize_stream(0)


def deviceSynchronize() -> None:  # noqa: N802
    _gpu.GPU.synchronize()


@atexit.register
def _release() -> None:
    """Device memory lives as long as its process: this one's segments are unlinked as it exits (peers that
    mapped them keep their mappings until they exit too)."""
    mine = [(ptr, _maps[ptr][2]) for ptr in _segments if _maps[ptr][2].startswith(f"/dev/shm/fakecupy-{os.getpid()}-")]
    if mine:  # what a test of freeing (close() frees its IPC scratch) looks for in the output
        print(f"fakecupy: {len(mine)} device allocations never freed at exit "
              f"({sum(_segments[p] for p, _ in mine)} bytes)", file=sys.stderr, flush=True)
    for _ptr, path in mine:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


reclaim()  # a process that was killed before this one started: its device memory is gone
