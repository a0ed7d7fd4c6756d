"""The general way's last step: an op whose arguments were checked becomes an ``Op`` and starts.

Host buffers: the planner's schedule for the call (``planning.py``), run on the communicator's shared-memory
channel in issue order when it has lockstep steps, else as a task of the engine that awaits its messages.
GPU buffers: the GPU path (``gpu/runner.py``), made by the first GPU op. Every op takes its sequence number
here (or in a lane, from the same counters), so collectives match across ranks by issue order. While jax_ext
learns what an XLA custom call runs (``lanes/cpu.CAPTURE``) the op built is recorded; while the CPU lane
learns a call's form (``lanes/cpu.TEACHING``) it is taught the program.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from . import log
from .algorithms.schedule import Schedule
from .algorithms.table import BY_NAME
from .buffers import Buf, same_device
from .dtypes import ReduceOp, dtype_code
from .engine.op import Op
from .envvars import check_timeout
from .errors import InvalidArgument
from .lanes.cpu import CAPTURE, TEACHING
from .work import Work

if TYPE_CHECKING:
    from .engine.engine import Engine
    from .lanes.cpu import CpuLane
    from .lanes.gpu import GpuLane
    from .planning import Planner
    from .state import CommState
    from .tracking import Tracker

_log = log.get("COLL")


class Launcher:
    """Starts the ops of one communicator. ``side_group``: makes the private group the GPU path runs its host
    side on (a collective on this communicator: ``comm.split(0)``); ``local_size``: ranks on this host."""

    def __init__(self, engine: Engine, state: CommState, planner: Planner, tracker: Tracker, cpu: CpuLane,
                 gpu_lane: GpuLane, borrow_bytes: int, local_size: int, side_group: Callable[[], Any]) -> None:
        self._engine = engine
        self._state = state
        self._planner = planner
        self._tracker = tracker
        self._cpu = cpu
        self._gpu_lane = gpu_lane
        self._borrow_bytes = borrow_bytes
        self._local_size = local_size
        self._side_group = side_group
        self.gpu: Any = None  # GpuRunner, made by the first op on GPU buffers

    def collective(self, name: str, count: int, root: int, inp: Buf, out: Buf, op: ReduceOp | None,
                   result: Callable[[], Any], timeout: float | None, in_place: bool = False,
                   stream: Any = None) -> Work[Any]:
        """A collective whose buffers the general way has checked and viewed: on the GPU path, or planned."""
        state = self._state
        t = state.timeout if timeout is None else check_timeout(timeout)
        if not (isinstance(inp.array, np.ndarray) and isinstance(out.array, np.ndarray)):  # GPU, or mixed
            same_device(name, inp, out)  # raises for mixed devices
            state.usable()
            work, start = self.gpu_runner().prepare(name, count, root, inp, out, op, result, t, stream)
            desc = (count, out.array.dtype, op, root if BY_NAME[name].rooted else None)
            if start is None:  # enqueued on the GPU: done, nothing for the engine to do
                work._desc = desc
                work._t0 = time.monotonic()
                self._tracker.record(work)
                return work  # type: ignore[no-any-return]
            return self._tracker.track(work, desc, start)
        if stream is not None:
            raise InvalidArgument(f"{name}: stream= orders ops on GPU buffers; these buffers are in host memory")
        dt = out.array.dtype
        same = in_place or inp.array is out.array  # peers must not read a buffer this rank overwrites
        planner = self._planner
        plan = planner.plans.get((name, count, dt, root, in_place, same)) or planner.new(name, count, dt, root,
                                                                                         in_place, same)
        fo = out.array.reshape(-1)
        return self.launch(name, plan[0], fo if inp is out else inp.array.reshape(-1), fo, op, count, root, t, result,
                           plan[1])

    def launch(self, name: str, sched: Schedule, inp: np.ndarray, out: np.ndarray, op: ReduceOp | None,
               count: int, root: int, timeout: float, result: Callable[[], Any], native: Any = None) -> Work[Any]:
        """Run this rank's ``sched`` (any schedule of the one vocabulary) as collective ``name``: on the
        communicator's shared-memory channel, in issue order, when it has lockstep steps, else as a task of
        the engine that awaits its messages."""
        state = self._state
        shm = state.shm if sched.lockstep else None
        if sched.lockstep and shm is None:
            raise InvalidArgument(f"{name}: a schedule with shared-memory steps needs ranks on one host")
        dt, coll = out.dtype, BY_NAME[name]
        desc = (count, dt, op, root if coll.rooted else None)
        lane = self._cpu.native
        if lane is not None and lane.pending:
            self._cpu.adopt_orphan()
        with state.lock:
            if state.closed is not None or state.parent is not None:
                state.usable()
            seq, order = state.counters.take(shm is not None)  # the channel runs its ops in issue order
        op_: Op[np.ndarray] = Op(name, coll.code, seq, inp, out, dtype_code(dt) if name != "barrier" else 0, op,
                                 count, root, timeout, None, result, sched, order, desc, native)
        if CAPTURE.ops is not None:  # jax_ext learning what a custom call runs (lanes/cpu.py)
            CAPTURE.ops.append((op_, native))  # (the op lets go of its program once it has to wait)
        elif TEACHING.call is not None and native is not None and shm is not None:
            self._cpu.teach(op_, native)  # the lane runs this call's form from now on (lanes/cpu.py)
        _log.debug("%s seq %d: %d x %s, algorithm %s%s", name, seq, count, dt, sched.algo,
                   " over shared memory" if shm is not None else "")
        track = self._tracker.track
        if shm is not None:  # a small op from another thread may run here, inside the call (placement.py)
            return track(op_.work, desc, shm.submit, op_, borrow=0 < self._borrow_bytes >= count * dt.itemsize)
        return track(op_.work, desc, self._engine.run_collective, state.view, op_)

    def gpu_p2p(self, kind: str, buf: Buf, peer: int, tag: int, result: Callable[[], Any], timeout: float,
                stream: Any) -> Work[Any]:
        work, start = self.gpu_runner().prepare_p2p(kind, buf, peer, tag, result, timeout, stream)
        return self._tracker.track(work, (buf.array.size, buf.array.dtype, None, None), start)

    def gpu_runner(self) -> Any:
        """The GPU path, set up by the first op on GPU buffers (which every rank issues at the same point:
        setting up takes a collective on this communicator)."""
        if self.gpu is None:
            from .gpu.owner import Owner
            from .gpu.runner import GpuRunner  # imports nothing from cupy until here

            # the private group for its host side: a collective, issued now, at the same point on every rank
            side = self._side_group()
            view = self._state.view
            self.gpu = GpuRunner(Owner(view.rank, view.size, self._local_size, f"{view.ctx:x}", self._engine, side,
                                       self._state.recorder.entries.append, self._publish_gpu_lane))
        return self.gpu

    def _publish_gpu_lane(self, lane: Any) -> None:
        self._gpu_lane.publish(self.gpu, lane)
