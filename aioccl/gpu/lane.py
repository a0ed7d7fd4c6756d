"""The device path's ops in native code: the GPU lane (``aioccl/native/src/py/gpu_lane.c``) and what feeds it.

Python builds an op's launches once per call (``DevicePath._launches``); here they become a native
``GpuPlan`` (each launch's function, grid and arguments packed into 8-byte slots). Every op of a device
path with a lane is then launched by the lane, on either road:

* the general way (``DevicePath.enqueue``): argument checks, the op record, the plan; the lane launches
  it, records its event and tracks it;
* a call seen before (``Communicator``'s collectives, first thing): ``lane.run`` finds the call's plan by
  its buffers, count, dtype, op, root and the current stream, and does the whole op in C: sequence
  number, launches, event, a Work born done, the flight recorder. No Python runs between the call and
  ``cuLaunchKernel``. ``learn`` teaches it a call right after the general way ran it, and only when the
  Work it returned is what ``run`` would return. Buffers are cupy arrays, or torch CUDA tensors on torch's
  current stream (``takes_tensor``: what the c10d backend's calls on CUDA tensors hand it).

Without the native core (``AIOCCL_NATIVE=0``), without a CUDA driver (``AIOCCL_CUDA_DRIVER``, default
``libcuda.so.1``; the test stand-in cupy has one only through ``tests/native/bridge_cuda.c``) or for a
kernel with no driver function, the device path launches from Python.
"""

from __future__ import annotations

import sys
from typing import Any

from .. import log, native
from ..group import current_group
from ..work import BORN_DONE_LOCK, Work
from .launch import Launch, driver_library
from .owner import Owner

_log = log.get("GPU")
_driver: list[str] = []  # "" once libcuda is loaded, else why it could not be


def _load_driver() -> str:
    """Why the lane cannot run ("" when it can): the native core and the CUDA driver, loaded once."""
    core = native.core
    if core is None:
        return f"native core {native.why_not}"
    if not _driver:
        try:
            core.load_cuda(driver_library())
            _driver.append("")
        except OSError as e:
            _driver.append(str(e))
    return _driver[0]


def make(dp: Any, owner: Owner, seq: int) -> Any:
    """A lane for device path ``dp`` of the communicator ``owner`` describes (whose next GPU op takes
    ``seq``), or None with the reason logged; it starts switched off."""
    why = _load_driver()
    cp, core = dp.cp, native.core
    drv: Any = getattr(cp.cuda, "driver", None)
    if not why and (drv is None or not hasattr(drv, "ctxGetCurrent")):
        why = "this cupy has no driver context call"
    if not why and dp.nranks > 64:
        why = f"{dp.nranks} ranks (the lane takes up to 64)"
    if why:
        _log.info("GPU ops launch from Python: %s", why)
        return None
    with cp.cuda.Device(dp.dev):
        ctx = int(drv.ctxGetCurrent())
    placement = owner.engine.placement
    flags = tuple(dp.flag_ptr(r) for r in range(dp.nranks))
    assert core is not None
    return core.GpuLane(
        Work, BORN_DONE_LOCK, placement, placement.thread_id, owner.record, current_group,
        cp.ndarray, cp.cuda.get_current_stream, lambda: cp.cuda.Event(disable_timing=True), dp.err_ptr,
        0 if dp.form == "spin" else 1, dp.rank, flags, ctx, seq, dp.epoch)


def _slots(launch: Launch) -> bytes:
    """The launch's arguments, one per 8-byte slot (a 4-byte value in the slot's first half: little-endian)."""
    out = bytearray()
    for v in launch.values:
        b = bytes(v)
        out += b + b"\0" * (8 - len(b))
    return bytes(out)


def plan(launches: list[tuple[Launch, Launch | None]]) -> Any:
    """The native plan of an op's launches (see ``DevicePath._launches``), or None when a kernel has no driver
    function (the test stand-in's): then the op launches from Python."""
    core = native.core
    assert core is not None
    pieces = []
    for launch, consume in launches:
        if launch.fn is None or (consume is not None and consume.fn is None):
            return None
        pieces.append(tuple((x.fn, x.grid, x.threads, _slots(x), x.epoch_at)
                            for x in (launch, consume) if x is not None))
    return core.GpuPlan(tuple(pieces))


def takes_tensor(lane: Any, x: Any, dev: int) -> bool:
    """Whether ``x`` is a torch CUDA tensor the lane can take (a ``torch.Tensor`` itself, not a subclass: what
    ``run`` checks), after telling the lane torch's tensor type and current stream (``take_tensors``). Why
    here, not at the lane's making: torch may be imported after the first GPU op, and is never imported by
    aioccl for it."""
    torch = sys.modules.get("torch")
    if torch is None or x.__class__ is not torch.Tensor or not x.is_cuda:
        return False
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # torch's current stream of a device, a handle
    if raw is None:
        return False
    lane.take_tensors(torch.Tensor, raw, dev)
    return True


def entry(work: Any, last: Any, code: int) -> tuple[Any, ...] | None:
    """What a caller outside Python launches again for the op the general way has just run as ``work``:
    ``(plan, name, desc, kind, timeout)`` when ``last`` (the device path's last launch: seq, plan, stream,
    timeout) is that op's, done without an error; else None. The plan holds the op's buffer addresses: it
    is this call's, on these buffers, on ``last``'s stream (jax_ext's CUDA custom calls, xla_ffi_gpu.c)."""
    if last is None or last[0] != work.seq or work._exc is not None or not work.done() or last[1] is None:
        return None
    return (last[1], work.op, work._desc, code, float(last[3]))


def launched(dp: Any, work: Any, code: int) -> tuple[Any, Any]:
    """(device path ``dp``'s lane, ``entry`` for ``work``), or (None, None) when the op was not one launch of
    the lane (no device path, no lane, or another op last)."""
    lane = getattr(dp, "lane", None)
    got = entry(work, dp.last, code) if lane is not None else None
    return (lane, got) if got is not None else (None, None)


def learn(lane: Any, code: int, x: Any, out: Any, op: Any, root: int, work: Any, last: Any) -> None:
    """Teach ``lane`` the call ``(code, x, out, op, root)`` that the general way has just run as ``work``,
    when ``last`` (the device path's last launch: seq, plan, stream, timeout) is this op's on the current
    stream and the Work gives back what ``run`` can: ``x``, ``out`` or None (a rooted op's other ranks)."""
    if last is None or last[0] != work.seq or work._exc is not None or not work.done():
        return
    got = work._result
    gives = 0 if got is x else 1 if out is not None and got is out else 2 if got is None else -1
    _, plan_, stream, timeout = last
    if plan_ is not None and gives >= 0:
        lane.learn(lane.key(code, x, out, op, root, stream),
                   (plan_, work.op, work._desc, code, float(timeout), gives))
