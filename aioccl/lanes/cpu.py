"""The CPU lane's one owner: host buffers of a same-host communicator, from the call to the done Work in C.

``open`` gives a communicator with a channel its native ``Lane`` (``native/src/py/fast_lane.c``,
``lane_calls.c``): ``comm.all_reduce(x)`` of a small array in place runs there, and every other collective
call on host buffers once the lane has seen its *form*: the general way checks the first call of a form and
runs it, ``_launch`` then teaches the lane the form (``teach``: which buffers the program reads and writes,
what the Work gives back), and later calls of that form run from the call to the done Work in C. A
communicator of one rank has a lane without a channel (its all_reduce is done in the call).

What it takes and declines (``RULES``; docs/architecture.md's table is checked against it): host buffers
only (numpy arrays, and dense CPU tensors through their numpy views); no ``stream=``; a timeout of the call's
own is taken (an op done in the call never waits; one handed over keeps that deadline). Its native entry
declines what it cannot run now (answers.h): switched off, buffers it does not take, a form not learnt, the
channel busy, a group open, jax_ext learning.

An op the lane started and could not finish there (a late peer, a failure) comes back as a ``Handover``; it
is built into an ``Op`` here (``ops.py``) and submitted to the channel, which parks, owns its deadline and
resumes it. Until that is done the lane keeps the op as *pending*, so a signal that interrupts the caller in
between loses nothing: the next op adopts it. The engine below never makes, holds or switches a lane.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import native
from ..algorithms.table import BY_NAME
from ..buffers import address
from ..dtypes import ReduceOp, dtype_code, loaded_bfloat16
from ..engine.op import Op
from ..engine.shm import native as shm_native
from ..group import current_group
from ..native.answers import Declined, Handover
from ..work import BORN_DONE_LOCK, Work
from .call import HOST, NONE, TENSOR, Call
from .door import switch_off


def _bfloat16_num() -> int:
    """bfloat16's numpy type number for the core, or -1 while ml_dtypes is not imported: the core then learns
    it from ml_dtypes the first time it meets a user-defined dtype (fast_lane.c, ``acpy_lane_dtype``)."""
    bf = loaded_bfloat16()
    return -1 if bf is None else bf.num


if TYPE_CHECKING:
    from ..engine.engine import Engine
    from ..planning import Planner
    from ..state import CommState
    from ..tracking import Tracker


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
# where a program's buffer comes from and what the Work gives back (lane_calls.c's FROM_* and GIVES_*)
FROM_X, FROM_OUT, FROM_FRESH, FROM_NONE = range(4)
GIVES_X, GIVES_OUT, GIVES_NONE, GIVES_FRESH = range(4)
_OFF, _STREAM, _BUFFERS, _LEARNING = Declined("off"), Declined("stream"), Declined("buffers"), Declined("learning")


def _no_lane(code: int, x: Any, out: Any, op: Any, root: Any) -> Declined:
    """The first try while there is no native lane (no core, no channel yet, or several hosts)."""
    return _OFF


class CpuLane:
    """The CPU lane of one communicator: ``state`` (its channel, counters, recorder), the ``engine`` it borrows
    and the ``tracker`` that follows an op it hands over."""

    name = "cpu"
    RULES: tuple[tuple[str, str], ...] = (
        ("off", "no native core, no shared-memory channel (ranks on several hosts), or the communicator is "
                "closed, aborted, shrunk or lost a rank"),
        ("stream", "stream= is given"),
        ("buffers", "a buffer is not a host array (a GPU or JAX array, a bfloat16 or non-dense tensor), or is "
                    "not contiguous, aligned and writable, or of a dtype or reduction the core lacks"),
        ("learning", "jax_ext is learning on this thread what an op runs"),
        ("form", "a call form not learnt yet: the lane has the general way run it and learns it"),
        ("busy", "the channel has other ops queued, or another thread holds the engine"),
        ("group", "inside comm.group()"),
        ("size", "larger than the native core's limit (its programs), or empty"),
    )

    def __init__(self, engine: Engine, state: CommState, tracker: Tracker) -> None:
        self._engine = engine
        self._state = state
        self._tracker = tracker
        self.planner: Planner | None = None  # (the communicator's, given once made: it asks this lane to learn)
        self.native: Any = None  # the native Lane, once open
        self.on = False  # (the door's: a native lane, not switched off)
        self.first: Any = _no_lane  # the door's first try: the native Lane's call(), once open
        state.on_off(self.off)

    def open(self) -> None:
        """The native core's lane over the communicator's channel (which then owns the counters). The
        communicator's state switches it off when it closes, shrinks or loses a rank (``off``), for callers
        that hold only the lane (an XLA custom call, on XLA's thread, without the GIL)."""
        state = self._state
        core, shm = native.core, state.shm
        if core is None or (shm is None and state.view.size != 1) or (shm is not None and shm.native is None):
            return
        if shm is not None:  # how large an op the core takes depends on whether the channel reads in place
            state.native_max = shm_native.max_bytes(in_place=shm.readers is not None)
        placement = self._engine.placement
        counters = state.counters
        ring_bells = functools.partial(shm_native.ring_bells, shm) if shm is not None else None
        lane = core.Lane(
            shm.native if shm is not None else None, Work, BORN_DONE_LOCK, placement, placement.thread_id,
            placement.lock, current_group, state.recorder.entries.append, ring_bells, tuple(ReduceOp),
            _bfloat16_num(), state.native_max, counters.seq, counters.order)
        self.native = state.counters = lane
        self.first = lane.call
        self.on = True
        if state.closed is not None or state.member_lost is not None:
            self.off()  # (a member lost while the channel was set up)

    def off(self) -> None:
        switch_off(self)

    def check(self, call: Call) -> Declined | None:
        if not self.on:
            return _OFF
        first = call.first
        if first is not None and first.reason != "form" and (
                call.kind == HOST or (call.code == _ALL_REDUCE and call.out is None)):
            return first  # (what its native entry said of these very arguments: a CPU tensor viewed included)
        if call.stream is not None:
            return _STREAM
        if call.kind not in (HOST, TENSOR, NONE):
            return _BUFFERS
        if CAPTURE.ops is not None:  # jax_ext learning what a custom call runs: it must see the op built
            return _LEARNING
        return None

    def try_call(self, call: Call) -> Work[Any] | Declined | Handover:
        """The call through the native lane with the record's host views. A form it has not learnt is declined
        with ``call.teach`` set: the general way runs it and, on this thread, teaches the lane (``teach``)."""
        lane = self.native
        if call.code == _ALL_REDUCE and call.out is None:  # in place: the small all_reduce (planning teaches it)
            if call.first is not None:
                return call.first  # (what it answered on these very arguments, a CPU tensor's view included)
            return lane.all_reduce(call.xa, call.op, call.x)  # type: ignore[no-any-return]
        if call.kind == HOST and call.timeout is None and call.first is not None:
            got = call.first  # (the same arguments: asking again would give the same answer)
        else:
            got = lane.run(call.code, call.xa, call.oa, call.op, call.root, call.x, call.out)
        if got.__class__ is Declined and got.reason == "form":  # the general way runs it and teaches the lane
            call.teach = (call.code, call.xa, call.oa, call.op, call.root, call.x, call.out)
        return got

    def teach(self, op_: Op[Any], program: Any) -> None:
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
        self.native.teach(code, xa, oa, op, root, (program, op_.name, op_.desc, template, in_from, out_from, gives,
                                                   op_.dtype_code, fresh))

    def carry_on(self, handed: Handover, call: Call | None = None) -> Work[Any]:
        """An op the native lane started and must wait for (a late peer, a failure): the channel carries it on,
        as any op it runs, with the call's own deadline."""
        work = self._hand_over(handed, None if call is None else call.timeout)
        self.native.claim()  # handed over: nothing left for _launch to adopt
        return work

    def _hand_over(self, handed: Handover, timeout: float | None) -> Work[Any]:
        shm = self._state.shm
        assert shm is not None and self.planner is not None
        if handed.template is None:  # the small in-place all_reduce: its op is built from the array
            x = handed.inp
            dt, count, rop = x.dtype, x.size, ReduceOp.parse(handed.op)
            sched = self.planner.get("all_reduce", count, dt, 0, False, True)[0]
            template = ("all_reduce", _ALL_REDUCE, dtype_code(dt), rop, count, 0, sched, (count, dt, rop, None))
        else:
            template = handed.template
        op_ = Op.from_template(template, handed.seq, handed.order, handed.inp, handed.out,
                               self._state.op_timeout(timeout), handed.given)
        shm_native.carry_on(shm, op_, handed.rc)
        return self._tracker.track(op_.work, op_.desc, shm.submit, op_)

    def adopt_orphan(self) -> None:
        """An op handed over to the engine whose caller was interrupted (a signal) before the engine had it:
        submit it now, ahead of the next op (peers count on it; nobody awaits it)."""
        handed = self.native.claim()
        shm = self._state.shm
        if handed is not None and shm is not None and shm.next_order <= handed.order:
            self._hand_over(handed, None)._retrieved = True  # its caller was told, by the interrupt

    def resume_native(self, template: Op[Any], rc: int, seq: int, order: int, inp: np.ndarray,
                      out: np.ndarray) -> Work[Any]:
        """An op an XLA custom call started in the native core and could not finish there (``rc``: it waits, or
        failed; ``native.core.UNSUITABLE``: nothing was published). It took ``seq`` and ``order``; ``template``
        is the op the call learnt from. The channel carries it on (or runs it) as any of its ops."""
        shm = self._state.shm
        assert shm is not None and native.core is not None
        op_ = Op.from_template((template.name, template.code, template.dtype_code, template.op, template.count,
                                template.root, template.sched, template.desc), seq, order, inp, out, template.timeout,
                               None)
        if rc != native.core.UNSUITABLE:
            shm_native.carry_on(shm, op_, rc)
        return self._tracker.track(op_.work, template.desc, shm.submit, op_)


_ALL_REDUCE = BY_NAME["all_reduce"].code
