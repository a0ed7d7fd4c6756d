"""Setting the device path up: scratch with its flag header shared through CUDA IPC, and the form chosen.

Every rank allocates its scratch (``kernels/gpu_piece.py``'s header, then two
data halves), exports it, opens the peers', and all agree, or all fall back
to the staged path with the reason. Then the ranks time a dozen hand-offs
between their kernels: where a kernel spinning on another process's flag
waits for a time slice (processes sharing a GPU without MPS), the stream
form is chosen (``device_path.py``).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import time
from typing import Any

import numpy as np

from .. import log
from ..envvars import env_int
from ..errors import InvalidArgument
from ..kernels import gpu_piece as K
from .device_path import EPOCH_ARG, DevicePath
from .ipc import EXPORT_BYTES, Export, IpcTable
from .launch import Launch
from .piece import Piece

_log = log.get("GPU")
H2D, D2H = 1, 2
SPIN_HANDOFF_US = 200.0  # the probe's hand-off time under which the ranks' kernels run at once
PROBE_LAUNCHES = 12


async def setup(cp: Any, side: Any, dev: int, scratch_bytes: int, timeout: float, comm_id: str) -> DevicePath | str:
    """The device path, or why some rank cannot use it (every rank gets the same answer)."""
    rt = cp.cuda.runtime
    reason, own = "", 0
    export = Export(bytes(64), 0, os.getpid(), dev)
    if os.environ.get("AIOCCL_GPU_IPC", "1") == "0":
        reason = "AIOCCL_GPU_IPC=0"
    else:
        try:
            with cp.cuda.Device(dev):
                size = K.HEADER_BYTES + scratch_bytes  # the header, then the two data halves
                own = rt.malloc(size)  # outside cupy's pool: the handle covers just this
                zeros = np.zeros(K.HEADER_BYTES, np.uint8)
                rt.memcpy(own, zeros.ctypes.data, K.HEADER_BYTES, H2D)
                export = Export(rt.ipcGetMemHandle(own), size, os.getpid(), dev)
        except Exception as e:  # noqa: BLE001
            reason = f"cannot export scratch: {e}"
    mine = np.frombuffer(export.encode(), dtype=np.uint8)
    everyone = (await side.all_gather(mine, timeout=timeout)).reshape(side.world_size, EXPORT_BYTES)
    table = IpcTable(side.rank, own, lambda h: rt.ipcOpenMemHandle(h), rt.ipcCloseMemHandle)
    exports = [Export.decode(everyone[r].tobytes()) for r in range(side.world_size)]
    if not reason:
        try:
            with cp.cuda.Device(dev):
                for r, ex in enumerate(exports):
                    table.add(r, ex)
        except Exception as e:  # noqa: BLE001
            reason = f"cannot open a peer's scratch: {e}"
    agreed = await side.all_reduce(np.array([0 if reason else 1], dtype=np.int32), "min", timeout=timeout)
    if not int(agreed[0]):
        table.close()
        if own:
            rt.free(own)
        return reason or "a peer could not use CUDA IPC"
    half = ((min(ex.nbytes for ex in exports) - K.HEADER_BYTES) // 2) & ~255
    with cp.cuda.Device(dev):
        bases = cp.asarray(np.array([table.ptr(r) for r in range(side.world_size)], dtype=np.uint64))
        err_ptr = rt.hostAlloc(32, 2)  # mapped: the kernels write the error word; then 16 bytes for _read
        cp.cuda.Device(dev).synchronize()  # the table is copied in before any stream reads it
    ctypes.memset(err_ptr, 0, 32)
    dp = DevicePath(cp, side.rank, side.world_size, dev, table, own, half, bases, err_ptr, comm_id,
                    env_int(os.environ, "AIOCCL_GPU_SMALL_BYTES", 0, 0))
    await _choose_form(dp, side, exports, timeout)
    return dp

async def _choose_form(dp: DevicePath, side: Any, exports: list[Export], timeout: float) -> None:
    choice = os.environ.get("AIOCCL_GPU_SYNC", "auto")
    if choice not in ("auto", "spin", "stream"):
        raise InvalidArgument(f"AIOCCL_GPU_SYNC must be auto, spin or stream, got {choice!r}")
    shared = len({ex.device for ex in exports}) < len(exports)
    handoff_us, failed = 0.0, 0
    if choice == "auto" and shared:
        handoff_us, failed = await _probe(dp, min(timeout, 5.0))
    worst = await side.all_reduce(np.array([handoff_us, failed], dtype=np.float64), "max", timeout=timeout)
    handoff_us, failed = float(worst[0]), int(worst[1])
    if choice == "auto":
        spin = not shared or (not failed and handoff_us < SPIN_HANDOFF_US)
        choice = "spin" if spin else "stream"
        dp.why = ("one process per GPU" if not shared else
                    f"ranks share a GPU and a hand-off between their kernels took {handoff_us:.0f} us "
                    f"(MPS {'on' if spin else 'off'}, or as good as)")
    else:
        dp.why = "AIOCCL_GPU_SYNC"
    dp.err[:] = 0
    flag0 = np.zeros(1, np.uint32)
    with dp.cp.cuda.Device(dp.dev):
        dp.cp.cuda.runtime.memcpy(flag0.ctypes.data, dp.own, 4, D2H)
    top = await side.all_reduce(flag0.astype(np.int64), "max", timeout=timeout)
    dp.epoch = int(top[0])
    dp.form = choice
    _log.info("GPU ops use CUDA IPC (%d MiB per half), kernels synchronised by %s: %s", dp.half_bytes >> 20,
              "spinning on flags" if choice == "spin" else "stream waits on flags", dp.why)

async def _probe(dp: DevicePath, timeout: float) -> tuple[float, int]:
    """Microseconds per hand-off between the ranks' kernels (spin form), and whether any timed out."""
    cp = dp.cp
    kern = dp.kernel(np.dtype(np.uint8), None)
    with cp.cuda.Device(dp.dev):
        stream = cp.cuda.Stream(non_blocking=True)
        handoff = Launch(kern, dp.spin_grid, K.THREADS, dp.args(0, 0, 0, Piece(0, 0, 0, 0, 0, 0, 0, 0), 1, timeout,
                                                                K.PUBLISH | K.SYNC | K.CONSUME, 0), EPOCH_ARG)
        marks = []
        for i in range(PROBE_LAUNCHES):
            handoff(stream)
            if i in (0, PROBE_LAUNCHES - 1):
                ev = cp.cuda.Event(disable_timing=True)
                ev.record(stream)
                marks.append(ev)
    while not marks[0].done:  # polled without backing off: the measurement is in microseconds
        await asyncio.sleep(0)
    t0 = time.monotonic()
    while not marks[1].done:
        await asyncio.sleep(0)
    us = (time.monotonic() - t0) * 1e6 / (PROBE_LAUNCHES - 1)
    return us, int(dp.err[0] != 0)
