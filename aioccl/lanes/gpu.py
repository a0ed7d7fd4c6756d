"""The GPU lane at the door: a device-path collective seen before, from the call to its launches in C.

The native ``GpuLane`` (``native/src/py/gpu_lane.c``) is made and taught by the GPU path (``gpu/lane.py``,
``gpu/runner.py``) once the device path runs ops; this is how the door offers it a call. A call it has not
learnt yet is taken here too: the general way runs it and the GPU path learns its launches, so the next such
call runs in C. While jax_ext learns what a CUDA custom call launches (``CAPTURE``), every GPU call is taken
that way, its launches recorded.

What it takes and declines (``RULES``): GPU buffers only; no timeout of the call's own and no ``stream=``
(a learnt call is launched on the current stream with the communicator's deadline); an all_gather or
reduce_scatter only with ``out=`` (in place, the general way makes a new array).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..algorithms.table import BY_NAME
from ..native.answers import Declined, Handover
from ..work import Work
from .call import OTHER, Call
from .cpu import CAPTURE
from .door import switch_off

if TYPE_CHECKING:
    from ..state import CommState
    from .general import General

_OFF, _TIMEOUT, _STREAM = Declined("off"), Declined("timeout"), Declined("stream")
_BUFFERS, _FORM, _KIND = Declined("buffers"), Declined("form"), Declined("kind")
_NEEDS_OUT = {BY_NAME["all_gather"].code, BY_NAME["reduce_scatter"].code}
_BARRIER = BY_NAME["barrier"].code


class GpuLane:
    """The door's side of the GPU lane of one communicator: ``runner`` (the ``GpuRunner``, made by the first
    GPU op) and ``native`` (its ``GpuLane``) are set by the GPU path once the device path runs ops."""

    name = "gpu"
    RULES: tuple[tuple[str, str], ...] = (
        ("off", "no GPU lane yet (before the device path ran a GPU op, without the native core, on the staged "
                "path), or the communicator is closed, aborted, shrunk or lost a rank"),
        ("kind", "a barrier (no buffers)"),
        ("timeout", "the call names a timeout of its own"),
        ("stream", "stream= is given"),
        ("buffers", "host buffers (numpy arrays, CPU tensors)"),
        ("form", "an all_gather or reduce_scatter without out="),
        ("device", "another device or stream than the learnt call's, or a CUDA graph being captured"),
        ("group", "inside comm.group()"),
    )

    def __init__(self, state: CommState) -> None:
        self.general: General | None = None  # (the communicator's, given once made: a new call runs there)
        self.runner: Any = None
        self.native: Any = None
        self.on = False  # (the door's: a native lane, not switched off)
        self._off = False
        state.on_off(self.off)

    def publish(self, runner: Any, lane: Any) -> None:
        """The GPU path's native lane, now that the device path runs ops (``gpu/owner.py``); off at once if the
        communicator takes no more ops."""
        self.runner, self.native = runner, lane
        self.on = lane is not None and not self._off
        if lane is not None and self._off:
            lane.enabled = False

    def off(self) -> None:
        self._off = True
        switch_off(self)

    def check(self, call: Call) -> Declined | None:
        if not self.on or not self.native.enabled:  # (the GPU path switches its lane off while it sets up)
            return _OFF
        if call.code == _BARRIER:
            return _KIND
        if call.timeout is not None:
            return _TIMEOUT
        if call.stream is not None:
            return _STREAM
        if call.kind != OTHER:
            return _BUFFERS
        if call.out is None and call.code in _NEEDS_OUT:
            return _FORM
        return None

    def try_call(self, call: Call) -> Work[Any] | Declined:
        code, x, out, op, root = call.code, call.x, call.out, call.op, call.root
        runner = self.runner
        if CAPTURE.ops is not None:  # jax_ext learning what a CUDA custom call launches (lanes/cpu.py's CAPTURE)
            w: Work[Any] = runner.learning(code, x, out, op, root, lambda: self._general(call))
            CAPTURE.ops.append(("gpu", *runner.launched(w, code)))
            return w
        got = self.native.run(code, x, out, op, root)
        if got.__class__ is Declined and got.reason == "form":  # new: the general way, then the lane learns it
            return runner.learning(code, x, out, op, root, lambda: self._general(call))  # type: ignore[no-any-return]
        return got  # type: ignore[no-any-return]

    def _general(self, call: Call) -> Work[Any]:
        assert self.general is not None
        return self.general.run(call)

    def carry_on(self, handed: Handover, call: Call) -> Work[Any]:
        raise AssertionError("the GPU lane hands nothing over: a launched op completes on its stream")
