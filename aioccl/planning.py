"""Which schedule each call runs: chosen once per call shape and kept, with its program for the native core.

A part of each ``Communicator`` (``Planner``). Choosing (the tuner's cost model, the schedule's construction)
costs more than an 8-byte op's data, so the launcher looks a call up here first. A same-host communicator's
small lockstep schedule is also lowered for the native core (``engine/shm/native.py``), and an in-place
all_reduce's program handed to the fast lane.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .algorithms import plan
from .algorithms.schedule import Schedule
from .algorithms.shm import shm_plan
from .algorithms.table import BY_NAME
from .dtypes import dtype_code
from .engine.shm import native as shm_native

if TYPE_CHECKING:
    from .lanes.cpu import CpuLane
    from .state import CommState
    from .tuning import Tuning

PLAN_CACHE = 256  # distinct calls (collective, count, dtype, root, placement) whose schedules a communicator keeps


class Planner:
    """The schedules of one communicator (``state``: its ranks and channel), chosen by ``tuning`` for its
    hosts' ``layout``; ``lane``: the CPU lane, which learns the in-place all_reduce's program."""

    def __init__(self, state: CommState, tuning: Tuning, layout: tuple[int, ...], lane: CpuLane) -> None:
        self._state = state
        self.tuning = tuning  # (tests and tools change it, then ``forget``)
        self._layout = layout
        self._lane = lane
        # (call) -> its schedule, and that lowered for the native core (None: the Python executor)
        self.plans: dict[tuple[Any, ...], tuple[Schedule, Any]] = {}

    def get(self, name: str, count: int, dt: np.dtype[Any], root: int, in_place: bool,
            same: bool) -> tuple[Schedule, Any]:
        """The schedule of a call and its native program: kept, or chosen now."""
        return self.plans.get((name, count, dt, root, in_place, same)) or self.new(name, count, dt, root, in_place,
                                                                                  same)

    def new(self, name: str, count: int, dt: np.dtype[Any], root: int, in_place: bool,
            same: bool) -> tuple[Schedule, Any]:
        """Choose (and keep) the schedule of a call, and lower it for the native core where it can run it."""
        if len(self.plans) >= PLAN_CACHE:
            self.forget()
        sched = self._plan(name, count, dt, root, in_place, same)
        plan = self.plans[(name, count, dt, root, in_place, same)] = (sched, self._lower(name, sched, count, root, dt))
        lane = self._lane.native
        if name == "all_reduce" and same and plan[1] is not None and lane is not None:
            lane.learn(count, dtype_code(dt), plan[1])  # in place: the CPU lane's small all_reduce
        return plan

    def forget(self) -> None:
        """Drop every schedule chosen so far (and the CPU lane's programs): the next calls choose again."""
        self.plans.clear()
        if self._lane.native is not None:
            self._lane.native.forget()

    def _plan(self, name: str, count: int, dt: np.dtype[Any], root: int, in_place: bool, same: bool) -> Schedule:
        """This rank's schedule for one call on host buffers (the same call always gets the same one,
        so ``get`` keeps them: choosing costs more than an 8-byte op's data)."""
        shm, view = self._state.shm, self._state.view
        shm_algo = self.tuning.choose_shm(name, count, dt.itemsize, view.size) if shm is not None else None
        if shm is not None and shm_algo is not None:
            cap = max(1, shm.cap_bytes // dt.itemsize)
            return shm_plan(name, count, view.rank, view.size, root, cap, shm_algo, same)
        algo, chunk = self.tuning.choose(name, count, dt.itemsize, view.size, self._layout)
        return plan(name, count, view.rank, view.size, root, chunk, algo, in_place, self._layout)

    def _lower(self, name: str, sched: Schedule, count: int, root: int, dt: np.dtype[Any]) -> Any:
        """The native core's program for a small op on the shared-memory channel, or None."""
        shm = self._state.shm
        if shm is None or shm.native is None or not sched.lockstep or count * dt.itemsize > self._state.native_max:
            return None
        return shm_native.lower(sched, self._state.view.rank, self._state.view.size, BY_NAME[name].code, count, root)
