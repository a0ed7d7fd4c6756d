"""The fast lane's slow side: a small all_reduce the native core started in the call and could not finish
there (a late peer, a failure) goes on in the engine, like any op of the shared-memory channel.

A mixin of ``Communicator``, and the fast lane's one owner: ``_open_lane`` gives a communicator with a
channel its ``Lane`` (C): ``comm.all_reduce(x)`` of a small numpy array runs from the call to the done Work
there. The engine below never makes, holds or switches a lane: it only runs the channel's ops.
Every other collective call on host buffers runs there too once the lane has seen its *form* (``_by_lane``):
the general way checks the first call of a form and runs it; ``_launch`` then teaches the lane the form
(``_teach``: which buffers the program reads and writes, what the Work gives back), and later calls of that
form run from the call to the done Work in C (``native/src/py/lane_calls.c``).
An op the lane hands back (``(x, op, code, seq, order)``, or ``(template, in, out, code, seq, order, result)``)
is built into an ``Op`` here and submitted to the channel, which parks, owns its deadline and resumes it.
Until that is done the lane keeps the op as *pending*, so a signal that interrupts the caller in between
loses nothing: the next op adopts it.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np

from . import native
from .algorithms.table import BY_NAME
from .buffers import address
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
    jax_ext learns which program an XLA custom call runs (then runs it from C, jax_ext/native_call.py). A
    GPU op adds ``("gpu", its GPU lane, what to launch again)`` (``GpuRunner.launched``; Nones when the lane
    cannot launch it alone)."""

    ops: list[tuple[Any, ...]] | None = None

    @contextlib.contextmanager
    def learning(self) -> Iterator[list[tuple[Any, ...]]]:
        """The ops built on this thread inside the block, in a list; the lane stands aside meanwhile (the
        core's own flag for this thread: the lane reads it in C, without looking this object up)."""
        ops: list[tuple[Any, ...]] = []
        self.ops = ops
        if native.core is not None:
            native.core.set_learning(True)
        try:
            yield ops
        finally:
            self.ops = None
            if native.core is not None:
                native.core.set_learning(False)


CAPTURE = _Capture()


class _Teaching(threading.local):
    """The call whose form the lane does not know yet, while the general way runs it on this thread:
    ``(code, x, out, op, root, gx, gout)`` (x and out as the lane saw them, numpy arrays or None)."""

    call: tuple[Any, ...] | None = None


TEACHING = _Teaching()
NOT_HOST = object()
_EMPTY = np.zeros(0, np.uint8)
# where a program's buffer comes from and what the Work gives back (lane_calls.c's FROM_* and GIVES_*)
FROM_X, FROM_OUT, FROM_FRESH, FROM_NONE = range(4)
GIVES_X, GIVES_OUT, GIVES_NONE, GIVES_FRESH = range(4)


def host_view(x: Any) -> Any:
    """``x`` as the lane takes it: a numpy array or None as it is, a dense CPU torch tensor as its numpy view;
    ``NOT_HOST`` for anything else (the general way)."""
    if x is None or x.__class__ is np.ndarray:
        return x
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(x, torch.Tensor) or x.is_cuda:  # (a CUDA tensor's numpy() raises: ~10 us)
        return NOT_HOST
    try:  # a CPU tensor of a numpy dtype, without grad; a bfloat16, sparse or meta one raises (the general way)
        return x.numpy()
    except (RuntimeError, TypeError):
        return NOT_HOST


class FastLane:
    if TYPE_CHECKING:
        _lane: Any
        _gpu_lane: Any
        _pair_lane: Any
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
        lane without a channel (its all_reduce is done in the call). The communicator switches it off when it
        closes, shrinks or loses a rank (``_lane_off``), for callers that hold only the lane."""
        core, shm = native.core, self._shm
        if core is None or (shm is None and self._view.size != 1) or (shm is not None and shm.native is None):
            return
        if shm is not None:  # how large an op the core takes depends on whether the channel reads in place
            self._native_max = shm_native.max_bytes(in_place=shm.readers is not None)
        placement = self._engine.placement
        counters = self._counters
        ring_bells = functools.partial(shm_native.ring_bells, shm) if shm is not None else None
        self._lane = self._counters = core.Lane(
            shm.native if shm is not None else None, Work, BORN_DONE_LOCK, placement, placement.thread_id,
            placement.lock, current_group, self._recorder.entries.append, ring_bells, tuple(ReduceOp),
            np.dtype(ml_dtypes.bfloat16).num, self._native_max, counters.seq, counters.order)
        if self._closed is not None or self._member_lost is not None:
            self._lane.enabled = False  # (a member lost while the channel was set up)

    def _by_lane(self, code: int, x: Any, out: Any, op: Any, root: int, timeout: float | None,
                 general: Callable[[], Work[Any]], tried: Any = False) -> Work[Any] | None:
        """A collective on host buffers through the lane: the done Work of a call whose form it knows, the
        general way's Work for a form it does not (which then teaches it), or None: the caller's general way
        (buffers the lane does not take, or not now). ``tried``: what the caller's own ``lane.run(code, x,
        out, op, root)`` answered (its fast path), False when it did not try."""
        if tried is None:  # a known form that cannot run now
            return None
        if tried is not False:  # taken, and handed back to wait: the engine carries it on
            work = self._hand_over(tried, timeout)
            self._lane.claim()
            return work
        if CAPTURE.ops is not None:  # jax_ext learning what a custom call runs: it must see the op built
            return None
        xa = x if x is None or x.__class__ is np.ndarray else host_view(x)
        oa = out if out is None or out.__class__ is np.ndarray else host_view(out)
        if xa is NOT_HOST or oa is NOT_HOST:
            return None
        if timeout is not None:
            self._op_timeout(timeout)  # a bad one raises here, before anything is sent
        w = self._lane.run(code, xa, oa, op, root, x, out)
        if w.__class__ is Work:
            return w
        if w is None:
            return None
        if w is not False:
            work = self._hand_over(w, timeout)
            self._lane.claim()  # handed over: nothing left for _launch to adopt
            return work
        TEACHING.call = (code, xa, oa, op, root, x, out)
        try:
            return general()
        finally:
            TEACHING.call = None

    def _teach(self, op_: Op[Any], program: Any) -> None:
        """Teach the lane the form of the call the general way has just built as ``op_`` (``_launch``), when
        its program's buffers are the call's x, out or a fresh array, and its Work gives back x, out, that
        fresh array or None."""
        call, TEACHING.call = TEACHING.call, None
        assert call is not None
        code, xa, oa, op, root, gx, gout = call
        if code != op_.code:
            return
        got = op_.result()
        # a fresh array: made by the general way for this call (no base), not a view of x or out (a block)
        fresh = got if got.__class__ is np.ndarray and got.base is None and got is not gx and got is not gout \
            else None

        def source(a: np.ndarray) -> int:
            for from_, b in ((FROM_X, xa), (FROM_OUT, oa), (FROM_FRESH, fresh)):
                if b is not None and address(a) == address(b) and a.nbytes == b.nbytes:
                    return from_
            return FROM_NONE if a.size == 0 and xa is None and oa is None else -1

        in_from, out_from = source(op_.inp), source(op_.out)
        gives = (GIVES_NONE if got is None else GIVES_X if got is gx else GIVES_OUT if got is gout
                 else GIVES_FRESH if fresh is not None and out_from == FROM_FRESH else -1)
        if in_from in (-1, FROM_FRESH) or out_from == -1 or gives == -1:
            return
        template = (op_.name, op_.code, op_.dtype_code, op_.op, op_.count, op_.root, op_.sched, op_.desc)
        self._lane.teach(code, xa, oa, op, root, (program, op_.name, op_.desc, template, in_from, out_from, gives,
                                                   op_.dtype_code, fresh))

    def _lane_off(self) -> None:
        """The communicator takes no more ops (closed, aborted, shrunk, a member lost): its lane says so too,
        for the callers that read only the lane (an XLA custom call, on XLA's thread, without the GIL)."""
        if self._lane is not None:
            self._lane.enabled = False
        if self._gpu_lane is not None:
            self._gpu_lane.enabled = False
        if self._pair_lane is not None:
            self._pair_lane.enabled = False

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
        if len(handed) == 7:  # a call of a form the lane learnt (_by_lane)
            return self._hand_over_call(handed, timeout)
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

    def _hand_over_call(self, handed: tuple[Any, ...], timeout: float | None) -> Work[Any]:
        template, inp, out, rc, seq, order, given = handed
        name, code, dtype_code_, rop, count, root, sched, desc = template
        shm = self._shm
        assert shm is not None
        work: Work[Any] = Work(name, seq)
        flat_in = _EMPTY if inp is None else inp.reshape(-1)
        flat_out = _EMPTY if out is None else out.reshape(-1)
        op_ = Op(name, code, seq, flat_in, flat_out, dtype_code_, rop, count, root, self._op_timeout(timeout), work,
                 lambda: given, sched, order, desc)
        work._probe = op_.blocked_on
        shm_native.carry_on(shm, op_, rc)
        return self._track(work, desc, shm.submit, op_)

    def _adopt_orphan(self) -> None:
        """A fast-lane op handed over to the engine whose caller was interrupted (a signal) before the engine
        had it: submit it now, ahead of the next op (peers count on it; nobody awaits it)."""
        handed = self._lane.claim()
        shm = self._shm
        if handed is not None and shm is not None and shm.next_order <= handed[5 if len(handed) == 7 else 4]:
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
