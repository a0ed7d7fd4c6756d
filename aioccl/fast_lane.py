"""The fast lane's slow side: a small all_reduce the native core started in the call and could not finish
there (a late peer, a failure) goes on in the engine, like any op of the shared-memory channel.

A mixin of ``Communicator``, and the fast lane's one owner: ``_open_lane`` gives a communicator with a
channel its ``Lane`` (C): ``comm.all_reduce(x)`` of a small numpy array runs from the call to the done Work
there. The engine below never makes, holds or switches a lane: it only runs the channel's ops.
An op it hands back (``(x, op, code, seq, order)``) is built into an ``Op`` here and submitted to the
channel, which parks, owns its deadline and resumes it. Until that is done the lane keeps the op as
*pending*, so a signal that interrupts the caller in between loses nothing: the next op adopts it.
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np

from . import native
from .algorithms.table import BY_NAME
from .dtypes import ReduceOp, dtype_code
from .engine.op import Op
from .engine.shm import native as shm_native
from .group import current_group
from .work import BORN_DONE_LOCK, Work

if TYPE_CHECKING:
    from .algorithms.schedule import Schedule
    from .engine.engine import Engine
    from .engine.shm.channel import ShmChannel
    from .engine.view import CommView
    from .errors import PeerLost
    from .introspection import FlightRecorder


class _Capture(threading.local):
    """The ops ``_launch`` builds on this thread, with their native programs, while ``ops`` is a list: how
    jax_ext learns which program an XLA custom call runs (then runs it from C, jax_ext/native_call.py)."""

    ops: list[tuple[Op[Any], Any]] | None = None


CAPTURE = _Capture()


class FastLane:
    if TYPE_CHECKING:
        _lane: Any
        _gpu_lane: Any
        _shm: ShmChannel | None
        _engine: Engine
        _view: CommView
        _counters: Any
        _recorder: FlightRecorder
        _native_max: int
        _closed: BaseException | None
        _member_lost: PeerLost | None
        _plans: dict[tuple[Any, ...], tuple[Schedule, Any]]

        def _new_plan(self, name: str, count: int, dt: np.dtype[Any], root: int, in_place: bool,
                      same: bool) -> tuple[Schedule, Any]: ...

        def _op_timeout(self, timeout: float | None) -> float: ...

        def _track(self, work: Work[Any], desc: Any, start: Any, *args: Any, borrow: bool = False) -> Work[Any]: ...

    def _open_lane(self) -> None:
        """The native core's fast lane over the channel (which then owns the counters): ``comm.all_reduce(x)``
        of a small numpy array runs from the call to the done Work in C. A communicator of one rank has a
        lane without a channel (its all_reduce is done in the call). The lane reads the communicator's
        ``_closed`` and ``_member_lost`` itself, for callers that hold only the lane."""
        core, shm = native.core, self._shm
        if core is None or (shm is None and self._view.size != 1) or (shm is not None and shm.native is None):
            return
        placement = self._engine.placement
        counters = self._counters
        ring_bells = functools.partial(shm_native.ring_bells, shm) if shm is not None else None
        self._lane = self._counters = core.Lane(
            shm.native if shm is not None else None, shm, self, Work, BORN_DONE_LOCK, placement, placement.thread_id,
            placement.lock, current_group, self._recorder.entries.append, ring_bells, tuple(ReduceOp),
            np.dtype(ml_dtypes.bfloat16).num, self._native_max, counters.seq, counters.order)
        if self._closed is not None or self._member_lost is not None:
            self._lane.enabled = False  # (a member lost while the channel was set up)

    def _lane_off(self) -> None:
        """The communicator takes no more ops (closed, aborted, shrunk, a member lost): its lane says so too,
        for the callers that read only the lane (an XLA custom call, on XLA's thread, without the GIL)."""
        if self._lane is not None:
            self._lane.enabled = False
        if self._gpu_lane is not None:
            self._gpu_lane.enabled = False

    def _carry_on(self, x: Any, op: ReduceOp | str, handed: tuple[Any, ...],
                  timeout: float | None = None) -> Work[Any]:
        """A fast-lane all_reduce (``_open_lane``) that must wait for a peer, or failed: the channel carries
        on with it, as with any op it runs."""
        work = self._hand_over(handed, timeout, x)
        if self._lane is not None:
            self._lane.claim()  # handed over: nothing left for _launch to adopt
        return work

    def _hand_over(self, handed: tuple[Any, ...], timeout: float | None = None, result: Any = None) -> Work[Any]:
        """``result``: what the Work gives back (the tensor whose view the lane ran on), by default the array."""
        x, op, rc, seq, order = handed
        given = x if result is None else result
        shm = self._shm
        assert shm is not None
        dt, count, rop = x.dtype, x.size, ReduceOp.parse(op)
        key = ("all_reduce", count, dt, 0, False, True)
        sched = (self._plans.get(key) or self._new_plan(*key))[0]
        flat = x.reshape(-1)
        desc = (count, dt, rop, None)
        work: Work[Any] = Work("all_reduce", seq)
        op_ = Op("all_reduce", BY_NAME["all_reduce"].code, seq, flat, flat, dtype_code(dt), rop, count, 0,
                 self._op_timeout(timeout), work, lambda: given, sched, order, desc)
        work._probe = op_.blocked_on
        shm_native.carry_on(shm, op_, rc)
        return self._track(work, desc, shm.submit, op_)

    def _adopt_orphan(self) -> None:
        """A fast-lane op handed over to the engine whose caller was interrupted (a signal) before the engine
        had it: submit it now, ahead of the next op (peers count on it; nobody awaits it)."""
        handed = self._lane.claim()
        shm = self._shm
        if handed is not None and shm is not None and shm.next_order <= handed[4]:
            self._hand_over(handed)._retrieved = True  # its caller was told, by the interrupt


    def _resume_native(self, template: Op[Any], rc: int, seq: int, order: int, inp: np.ndarray,
                       out: np.ndarray) -> Work[Any]:
        """An op an XLA custom call started in the native core and could not finish there (``rc``: it waits, or
        failed; ``native.core.UNSUITABLE``: nothing was published). It took ``seq`` and ``order``; ``template``
        is the op the call learnt from. The channel carries it on (or runs it) as any of its ops."""
        shm = self._shm
        assert shm is not None and native.core is not None
        work: Work[Any] = Work(template.name, seq)
        op_ = Op(template.name, template.code, seq, inp, out, template.dtype_code, template.op, template.count,
                 template.root, template.timeout, work, lambda: None, template.sched, order, template.desc)
        work._probe = op_.blocked_on
        if rc != native.core.UNSUITABLE:
            shm_native.carry_on(shm, op_, rc)
        return self._track(work, template.desc, shm.submit, op_)
