"""Which schedule each call runs: chosen once per call shape and kept, with its program for the native core.

A mixin of ``Communicator``. Choosing (the tuner's cost model, the schedule's construction) costs more
than an 8-byte op's data, so ``_collective`` looks a call up here first. A same-host communicator's
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
    from .engine.shm.channel import ShmChannel
    from .lanes.cpu import CpuLane
    from .tuning import Tuning

PLAN_CACHE = 256  # distinct calls (collective, count, dtype, root, placement) whose schedules a communicator keeps


class Planning:
    if TYPE_CHECKING:
        _plans: dict[tuple[Any, ...], tuple[Schedule, Any]]
        _shm: ShmChannel | None
        _tuning: Tuning
        _layout: tuple[int, ...]
        _cpu: CpuLane
        _native_max: int

        @property
        def rank(self) -> int: ...

        @property
        def world_size(self) -> int: ...

    def _new_plan(self, name: str, count: int, dt: np.dtype[Any], root: int, in_place: bool,
                  same: bool) -> tuple[Schedule, Any]:
        """Choose (and keep) the schedule of a call, and lower it for the native core where it can run it."""
        if len(self._plans) >= PLAN_CACHE:
            self._forget_plans()
        sched = self._plan(name, count, dt, root, in_place, same)
        plan = self._plans[(name, count, dt, root, in_place, same)] = (sched, self._lower(name, sched, count, root, dt))
        lane = self._cpu.native
        if name == "all_reduce" and same and plan[1] is not None and lane is not None:
            lane.learn(count, dtype_code(dt), plan[1])  # in place: the CPU lane's small all_reduce
        return plan

    def _forget_plans(self) -> None:
        """Drop every schedule chosen so far (and the fast lane's programs): the next calls choose again."""
        self._plans.clear()
        if self._cpu.native is not None:
            self._cpu.native.forget()

    def _plan(self, name: str, count: int, dt: np.dtype[Any], root: int, in_place: bool, same: bool) -> Schedule:
        """This rank's schedule for one call on host buffers (the same call always gets the same one,
        so ``_collective`` keeps them: choosing costs more than an 8-byte op's data)."""
        shm = self._shm
        shm_algo = self._tuning.choose_shm(name, count, dt.itemsize, self.world_size) if shm is not None else None
        if shm is not None and shm_algo is not None:
            cap = max(1, shm.cap_bytes // dt.itemsize)
            return shm_plan(name, count, self.rank, self.world_size, root, cap, shm_algo, same)
        algo, chunk = self._tuning.choose(name, count, dt.itemsize, self.world_size, self._layout)
        return plan(name, count, self.rank, self.world_size, root, chunk, algo, in_place, self._layout)

    def _lower(self, name: str, sched: Schedule, count: int, root: int, dt: np.dtype[Any]) -> Any:
        """The native core's program for a small op on the shared-memory channel, or None."""
        shm = self._shm
        if shm is None or shm.native is None or not sched.lockstep or count * dt.itemsize > self._native_max:
            return None
        return shm_native.lower(sched, self.rank, self.world_size, BY_NAME[name].code, count, root)

