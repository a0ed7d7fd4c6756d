"""A shared-memory channel's ops through the native core (``aioccl.native``): the small-op executor.

The native core runs the same lockstep protocol as ``executor.py`` (stage, publish, wait, read) on
the same segments and step counters, so it is one more way for a channel to run an op, chosen per
op: a small op whose schedule has only lockstep steps (no messages, copies or scratch) is *lowered*
once per call shape to a ``Program`` of words, and run in C, the GIL released, inside the call that
submits it. Ranks on either path meet: the descriptor, the slots and the reduction order are the
same, so results are bit-identical and a mismatch is found either way.

When the op has to wait longer than a spin (a late peer), the core returns the step it waits for
and the channel carries on as for any op: parks on the doorbell, owns the deadline, the verdict on a
timeout, a lost peer, and resumes the native op when the step comes (``resume``). Failures are the
same exceptions, raised by the channel.

Which ops: up to ``AIOCCL_NATIVE_MAX_BYTES`` (by default every size where the channel reads peers' buffers in
place, 1 MiB where it stages every byte: ``max_bytes``). A large op does not hold
the event loop's thread for long: the core returns after each ``AIOCCL_LOOP_SLICE_US`` of steps (phase 3,
waiting for nothing), and the channel resumes it once the loop has had a turn if anything waits for it
(``turns.py``), as it does between the Python executor's steps.
"""

from __future__ import annotations

import os
import time
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import log, native
from ...algorithms.schedule import IN, OUT, Fetch, Schedule
from ...algorithms.table import BY_NAME
from ...envvars import env_int
from ...errors import AiocclError
from ...transport.shm.segment import layout_differs
from ..executor import ALGO_CODES, _mismatch
from ..op import Op, Wait

if TYPE_CHECKING:
    from .channel import ShmChannel

_log = log.get("SHM")
# Every size where the channel reads peers' buffers in place: the core hands the loop back between slices of steps,
# and runs a large op faster than the Python executor (64 MiB all_reduce of 2 ranks: 19 against 25 ms). Where every
# byte is staged, up to 1 MiB (~0.3 ms): larger ones run no faster in C, and a 64 MiB all_gather ran slower
# (27 against 16 ms; docs/benchmarks.md, "Reading in place")
DEFAULT_MAX_BYTES, STAGED_MAX_BYTES = 1 << 50, 1 << 20


def max_bytes(env: Any = os.environ, in_place: bool = True) -> int:
    """``AIOCCL_NATIVE_MAX_BYTES``: the largest op (bytes of its buffer) the native core runs; by default every
    size on a channel that reads in place (``in_place``), 1 MiB on one that stages every byte."""
    return env_int(env, "AIOCCL_NATIVE_MAX_BYTES", DEFAULT_MAX_BYTES if in_place else STAGED_MAX_BYTES, 0, 1 << 50)


def channel(segments: list[Any], rank: int, spin_s: float, yield_cpu: bool, bells: tuple[Any, tuple[int, ...]],
            cma_min: int, slice_s: float) -> Any:
    """The core's half of a channel over its mapped segments, or None (no core, or it refuses them). It rings
    ``bells`` (the engine's doorbell, the channel's world ranks) from C, for an XLA custom call that finishes an
    op; reads buffers of ``cma_min`` bytes or more in place (0: never; every rank may read every other's memory);
    and a call runs steps for ``slice_s`` at most before it lets the loop turn (``turns.py``)."""
    core = native.core
    if core is None:
        return None
    differs = layout_differs(core)
    if getattr(core, "CODE_BROADCAST", None) != BY_NAME["broadcast"].code:  # its root writes into receivers
        differs = "; ".join(filter(None, (differs, "broadcast's code differs")))
    if differs:
        _log.warning("rank %d: the native core reads another segment layout (%s): shared-memory ops take the "
                     "Python path; rebuild aioccl (pip install .)", rank, differs)
        return None
    try:
        nat = core.Channel(segments, rank, int(spin_s * 1e9), yield_cpu)
    except ValueError as e:
        _log.info("rank %d: shared-memory ops take the Python path: %s", rank, e)
        return None
    bell, world = bells
    nat.set_bells(bell.sender(), [bell.address(bell.comm_id, w) for w in world])
    if cma_min:
        nat.set_cma(cma_min)
    nat.set_slice(int(slice_s * 1e9))
    return nat


class Counters:
    """A communicator's sequence numbers and channel orders, taken under its lock (the native ``Lane``,
    made by ``aioccl.fast_lane``, takes over both once the communicator has a channel)."""

    __slots__ = ("order", "seq")

    def __init__(self) -> None:
        self.seq = self.order = 0

    def take(self, on_channel: bool) -> tuple[int, int]:
        seq = self.seq
        self.seq += 1
        if not on_channel:
            return seq, -1
        order = self.order
        self.order += 1
        return seq, order


def lower(sched: Schedule, rank: int, size: int, code: int, count: int, root: int) -> Any:
    """``sched`` as a native Program, or None when it has anything but lockstep steps the core runs
    (messages, local copies, scratch space)."""
    core = native.core
    if core is None or not sched.steps or sched.messages or sched.scratch or size > core.MAX_RANKS:
        return None
    words = [core.PROG_MAGIC, len(sched.steps), int(sched.zero_copy), sched.divisor, code,
             ALGO_CODES.get(sched.algo, 0), count, root, 0, 0]
    ext = [0, 0]  # the elements of my IN and OUT the program touches: the core checks the buffers hold them
    for step in sched.steps:
        if not step.lockstep or step.copies:
            return None
        words.append(len(step.stage))
        for st in step.stage:
            words += (st.src.buf, st.src.start, st.src.stop, st.slot)
            if st.src.buf not in (IN, OUT):
                return None
            ext[st.src.buf] = max(ext[st.src.buf], st.src.stop)
        words.append(len(step.wait))
        words += step.wait
        words.append(len(step.reads))
        for rd in step.reads:
            srcs = (rd.src,) if isinstance(rd, Fetch) else rd.srcs
            words += (0 if isinstance(rd, Fetch) else 1, len(srcs))
            for s in srcs:
                if s.region.buf not in (IN, OUT):
                    return None
                words += (s.rank, s.region.buf, s.region.start, s.region.stop, s.slot)
                if s.rank == rank:  # (a peer's region is in its buffers: the core checks it against its mapping)
                    ext[s.region.buf] = max(ext[s.region.buf], s.region.stop)
            if rd.dst.buf not in (IN, OUT):
                return None
            words += (rd.dst.buf, rd.dst.start, rd.dst.stop)
            ext[rd.dst.buf] = max(ext[rd.dst.buf], rd.dst.stop)
        words.append(len(step.scale))
        for reg in step.scale:
            if reg.buf not in (IN, OUT):
                return None
            words += (reg.buf, reg.start, reg.stop)
            ext[reg.buf] = max(ext[reg.buf], reg.stop)
    words[8], words[9] = ext
    return core.Program(np.asarray(words, dtype=np.int64).tobytes(), rank, size)


def run(ch: ShmChannel, op: Op[np.ndarray]) -> bool:
    """Run ``op`` (the channel is idle, it is next in issue order): True when it finished in this call,
    False when it waits (``op.gen`` goes on with it: the channel parks, then resumes it)."""
    nat = ch.native
    if not op.work._start():
        return True  # failed already (abort)
    rc = nat.run(op.native, op.inp, op.out, op.dtype_code, op.fp[2], op.seq, op.order, op)
    if rc >= 0:
        op.work._set_result(op.result())
        return True
    core = native.core
    assert core is not None
    if rc == core.UNSUITABLE:  # nothing was published: the Python executor runs it
        op.native = None
        ch.begin(op)
        return False
    if rc == core.BELLS:
        _ring_bells(ch, nat)
        op.work._set_result(op.result())
        return True
    carry_on(ch, op, rc)
    nat.claim()  # handed on: nothing for adopt() to do
    return False


def adopt(ch: ShmChannel) -> None:
    """An op the core left unfinished whose caller was interrupted (a signal) before it handed the op on:
    it goes first in the channel's queue (peers count on it; its Work reports to whoever holds it)."""
    op = ch.native.claim()
    if op is None:
        return
    if op.gen is None:
        carry_on(ch, op, ch.native.last)
    if op not in ch.queue:
        ch.queue.appendleft(op)


def carry_on(ch: ShmChannel, op: Op[np.ndarray], rc: int) -> None:
    """The native op ``op`` (started) must wait, or failed: give it to the channel's own driver, which
    parks, owns its deadline and resumes it."""
    op.work._start()
    op.native = None  # never run again from the start
    op.deadline = time.perf_counter() + op.timeout
    op.base = ch.native.where[1]
    op.gen = _carry_on(ch, op, rc)


def _carry_on(ch: ShmChannel, op: Op[np.ndarray], rc: int) -> Generator[Wait, None, None]:
    """The native op's executor from where the core left it: yields the steps it waits for."""
    nat, core = ch.native, native.core
    assert core is not None
    finished = False
    try:
        while True:
            _ring_bells(ch, nat)
            if rc >= 0 or rc in (core.BELLS, core.NOT_CLEAN):  # NOT_CLEAN: the channel asks the verdict
                finished = True
                return
            if rc == core.MISMATCH:
                finished = True
                descs = nat.descriptors()
                raise _mismatch(ch, op, nat.peer, descs[nat.peer], descs[ch.rank])
            if rc != core.BLOCKED:
                finished = True
                raise AiocclError(f"{op.name} (seq {op.seq}) over shared memory: {nat.error}")
            phase, s = nat.blocked
            index = nat.where[0]
            if phase == 3:  # it ran its slice: the channel lets the loop turn if anything waits for it
                yield (), s
            else:
                ranks = ch.others if phase != 1 or index == 0 else op.sched.steps[index].wait
                yield ranks, s
            rc = nat.resume(int(ch.slice_end * 1e9))
    finally:
        if not finished:
            nat.reset()


def _ring_bells(ch: ShmChannel, nat: Any) -> None:
    """Ring the doorbells of the peers the core found parked when it published."""
    ring_bells(ch, nat.take_bells())


def ring_bells(ch: ShmChannel, mask: int) -> None:
    """Ring the doorbells of the peers in ``mask`` (bit j: the channel's j-th rank)."""
    j = 0
    while mask:
        if mask & 1:
            ch.bell.ring(ch.world[j])
            ch.stats["bells_rung"] += 1
        mask >>= 1
        j += 1
