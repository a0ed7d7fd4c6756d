"""The shared-memory channel of a communicator whose ranks all share one host.

Every such communicator has one, the world and its ``split``/``shrink`` children alike: on top of what it maps
(``.shm_memory``: the segments, my step counter, the slots), it drives the executor for a FIFO of collectives,
run one at a time in issue order (the slots are shared, so ops on one communicator are serialised, as on an NCCL
stream). All the channels of a process share one doorbell (its engine's ``LoopBell``).

Waiting, the part that decides latency:

1. *spin*: re-read the peers' counters for up to ``AIOCCL_SHM_SPIN_US``, yielding the CPU between reads
   (``AIOCCL_SHM_YIELD``; ``transport/shm/segment.py``'s ``wait_policy`` says why); a small op usually completes
   here, synchronously, inside the call that issued it (the engine runs it at once when launched on its own
   loop);
2. *park*: set my sleeping flag, fence, check once more, and return to the event loop; the peer that publishes
   the step I need sees the flag and rings my doorbell. A fence (a lock round trip: an atomic instruction) on
   both sides orders flag and counter, so a wake-up cannot be lost; a slow re-check timer backs it up
   regardless, and ``stats`` counts how often it was needed (it should stay 0).

Failure: an op past its deadline raises ``CollectiveTimeout`` naming the ranks that have not published the step
it waits for; ``shm_verdict.py`` makes that the outcome on every rank of the op (a late rank too), after which
each jumps its step counter past the op, to the same number (``_resync``), and the channel stays in step. A lost
peer leaves the ranks out of step, so the channel is then *broken*: later collectives on it fail at once. A
``CollectiveMismatch`` does not break it (see the executor).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import log
from ...errors import AiocclError, CollectiveMismatch, CollectiveTimeout, CommAborted
from ...transport.shm.fifo import fence
from ...transport.shm.segment import SLEEP, LoopBell, Segment, usable_cpus
from ..executor import execute
from ..notices import passed_on
from ..op import Op, Wait
from ..pool import BufferPool
from ..turns import loop_slice_s, loop_waits
from . import native as shm_native
from .memory import ChannelMemory
from .order import IssueOrder
from .verdict import Verdicts, timeout_maker

if TYPE_CHECKING:
    from ..services import EngineServices
    from ..view import CommView

_log = log.get("SHM")
RECHECK_S = 0.005  # backup re-check while parked; wake-ups come from the doorbell
RESYNC_JUMP = 1 << 32  # steps a timed-out op may span, at most: the next op starts past them on every rank


class ShmChannel(ChannelMemory):
    def __init__(self, loop: asyncio.AbstractEventLoop, rank: int, segments: Sequence[Segment], bell: LoopBell,
                 pool: BufferPool, spin_s: float, yield_cpu: bool, ctx: int = 0,
                 world: tuple[int, ...] | None = None, readers: list[Any] | None = None, cma_min: int = 0) -> None:
        super().__init__(rank, segments, bell, world, readers)
        self.loop = loop
        self.ctx = ctx  # the communicator's context id (failure notices name it)
        self._index = {w: j for j, w in enumerate(self.world)}
        self.pool = pool
        self.spin_s = spin_s
        self.yield_cpu = yield_cpu
        self.queue: deque[Op[np.ndarray]] = deque()
        self.held: dict[int, Op[np.ndarray]] = {}  # submitted ahead of an op with a lower number (see submit)
        self.broken: BaseException | None = None
        self.lost: dict[int, BaseException] = {}
        self.remote: dict[int, BaseException] = {}  # seq -> the error a peer gave that op up with
        # tells the peers that this rank gave up an op: (seq, fingerprint, error); set by the engine
        self.report: Any = None
        self.engine: EngineServices | None = None  # set with ``view`` when the engine attaches the channel
        self.view: CommView | None = None
        self._pumping = False
        self.slice_end = 0.0  # when this turn of the loop ends for the op in progress (time.monotonic())
        self._parked = False
        self._timer: asyncio.TimerHandle | None = None
        self.closed = False
        self.slice_s = loop_slice_s()
        self.verdicts = Verdicts(self.ctl, rank, segments[0].fd)  # one outcome for a given-up op
        # None: Python only. The core spins without yielding unless this host's ranks outnumber its cores:
        # beside a busy process one sched_yield costs a scheduler slice (ms), not the microseconds a look does
        self.native = shm_native.channel([s.mm for s in segments], rank, spin_s, self.size > usable_cpus(),
                                         (bell.bell, self.world), cma_min if readers is not None else 0, self.slice_s)
        self.issue_order = IssueOrder(self.native, self.held, self.queue)  # which op runs next (order.py)
        bell.listeners.append(self.on_bell)

    @property
    def next_order(self) -> int:
        """The issue number of the op the channel runs next (``order.py``)."""
        return self.issue_order.next_order

    # -- running ops ------------------------------------------------------------
    def submit(self, op: Op[np.ndarray]) -> None:
        """Queue an op (on the engine loop); runs it at once when the channel is idle.

        Ops run in *issue* order (``op.order``, taken with the sequence number), not in the order they
        reach the loop: an op issued inside ``comm.group()`` is launched only at the group's exit, so a
        later op from another task can arrive first, and every rank must run them in the same order.
        """
        op.chan = self
        if self.native is not None and self.native.pending:
            shm_native.adopt(self)  # ahead of this op, in issue order
            if not self._pumping:
                self._pump()
        if not self.issue_order.admit(op.order):  # an op ahead of it is still to come, or an XLA call holds the channel
            self.held[op.order] = op
            return
        idle = not self.queue and not self._pumping
        # the native core runs a small op here, in the call, when nothing is ahead of it (shm_native.py)
        if idle and op.native is not None and self.broken is None and shm_native.run(self, op):
            self.issue_order.finished()
        else:
            self.queue.append(op)
        self.issue_order.admit_held()
        if idle and self.queue:
            self._pump()

    def _pump(self) -> None:
        if self._pumping:
            return
        self._pumping = True
        self.slice_end = time.monotonic() + self.slice_s
        try:
            while self.queue:
                if not self._advance(self.queue[0]):
                    return
                self.queue.popleft()
                self.issue_order.finished()
        finally:
            self._pumping = False

    def _pump_after_turn(self) -> None:
        """A long op goes on two turns later: a due timer runs in this one, and the task it wakes in the next
        (resuming sooner put a slice between them: loop lag p50 0.46 ms beside 64 MiB all_reduces)."""
        self.loop.call_soon(self.loop.call_soon, self._pump)

    def _advance(self, op: Op[np.ndarray]) -> bool:
        """Run ``op`` until it finishes (True) or has to sleep (False)."""
        try:
            if op.gen is None:
                if not op.work._start():
                    return True  # failed already (abort)
                if self.broken is not None:
                    raise self.broken
                self.begin(op)
            gen = op.gen
            assert gen is not None
            while True:
                if op.waiting is not None:
                    if not self._wait(op, op.waiting):
                        return False
                    if time.monotonic() > self.slice_end:  # a large op: let other tasks run, if any wait
                        if loop_waits(self.loop):
                            self.loop.call_soon(self._pump_after_turn)
                            return False
                        self.slice_end = time.monotonic() + self.slice_s
                elif op.pending is not None and not self._settled(op, op.pending):
                    return False
                item = gen.send(None)  # on to what the executor waits for next: peers' steps, or a message
                if isinstance(item, tuple):
                    op.waiting = item
                else:
                    op.waiting = None
                    fut = op.pending = asyncio.ensure_future(item, loop=self.loop)
                    fut.add_done_callback(self._on_message)
        except StopIteration:
            self._release(op)
            self.stats["ops"] += 1
            late = None if self.verdicts.clean(op.order) else self.verdicts.finished(op.order, timeout_maker(op))
            if late is None:
                op.work._set_result(op.result())
            else:  # another rank gave it up first: raise what it raised, never a result it does not share
                self._resync(op)
                op.work._set_exception(late)
        except CollectiveMismatch as e:
            self._end(op)
            self._release(op)
            op.work._set_exception(e)
        except AiocclError as e:
            if isinstance(e, CollectiveTimeout) and self.verdicts.timed_out(op.order):
                self._resync(op)  # every rank of the op raises this timeout: the channel stays usable
            else:
                self._break(e)
            op.work._set_exception(e)
            self._tell(op, e)
        except Exception as e:  # a bug: never leave the Work hanging
            _log.exception("internal error in %s seq %d", op.name, op.seq)
            err = AiocclError(f"internal error in {op.name} (seq {op.seq}) over shared memory: {e!r}")
            self._break(err)
            op.work._set_exception(err)
            self._tell(op, err)
        return True

    def counts(self) -> dict[str, int]:
        """``stats`` with the native core's ops and spin hits added in."""
        counts = dict(self.stats)
        if self.native is not None:
            for k, v in self.native.stats.items():
                counts[k] += v
        return counts

    def begin(self, op: Op[np.ndarray]) -> None:
        """Give a started op its deadline, its scratch space and its Python executor."""
        op.deadline = time.perf_counter() + op.timeout
        op.base = self.step
        if op.sched.scratch:
            op.scratch_raw = self.pool.acquire(op.sched.scratch * op.out.itemsize)
            scratch = op.scratch_raw[:op.sched.scratch * op.out.itemsize].view(op.out.dtype)
        else:
            scratch = op.out[:0]
        assert self.engine is not None and self.view is not None
        op.gen = execute(self.engine, self.view, op, scratch, self)

    def _settled(self, op: Op[np.ndarray], fut: asyncio.Future[Any]) -> bool:
        """Has the message ``op`` waits for gone out or arrived (its error raised here)? Else park until it
        has, or until the op's deadline."""
        if fut.done():
            op.pending = None
            fut.result()
            return True
        now = time.perf_counter()
        if now >= op.deadline:
            raise CollectiveTimeout(op.name, op.seq, op.progress.waiting_for(), op.timeout,
                                    f"shared memory, algorithm {op.sched.algo}, messages")
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(op.deadline - now, self._on_timer)
        return False

    def _on_message(self, fut: asyncio.Future[Any]) -> None:
        if self.queue and self.queue[0].pending is fut and not self._pumping:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._pump()

    @staticmethod
    def _end(op: Op[np.ndarray]) -> None:
        """Close the executor of a failed op (it drops the receives it posted)."""
        gen, op.gen = op.gen, None
        if op.pending is not None:
            op.pending.cancel()
            op.pending = None
        if gen is not None:
            gen.close()

    def _tell(self, op: Op[np.ndarray], exc: AiocclError) -> None:
        if self.report is not None and not isinstance(exc, CommAborted):
            self.report(op.seq, op.fp, exc)

    def _release(self, op: Op[np.ndarray]) -> None:
        if op.scratch_raw is not None:
            self.pool.release(op.scratch_raw)
            op.scratch_raw = None

    def _wait(self, op: Op[np.ndarray], wait: Wait) -> bool:
        if self.reached(wait):
            if self._parked:
                self._unpark()
            return True
        now = time.perf_counter()
        end = now + self.spin_s
        if time.monotonic() + self.spin_s > self.slice_end and loop_waits(self.loop):  # wanted: spin in its turn
            end = now + max(0.0, self.slice_end - time.monotonic())
        while now < end:
            if self.yield_cpu:
                os.sched_yield()
            if self.reached(wait):
                self.stats["spin_hits"] += 1
                return True
            now = time.perf_counter()
        if now >= op.deadline:
            ranks, s = wait
            err = self.verdicts.give_up(op.order, lambda: self.reached(wait), self.missing(ranks, s), op.timeout,
                                        timeout_maker(op, s))
            if err is not None:
                raise err
            op.deadline = now + op.timeout  # the step came meanwhile, or a rank found the op complete: go on
            return self._wait(op, wait)
        if self.lost:  # every op here spans every rank: once one is gone, waiting on anyone is in vain
            lost = [j for j in self.missing(*wait) if j in self.lost] or list(self.lost)
            raise self.lost[lost[0]]
        told = self.remote.get(op.seq) if self.remote else None
        if told is not None:
            raise passed_on(told, self.rank, self.missing(*wait))
        if self.verdicts.timed_out(op.order):  # given up by a rank whose notice is still on its way
            err = self.verdicts.finished(op.order, timeout_maker(op))
            if err is not None:
                raise err
        me = self.ctl[self.rank]
        me[SLEEP] = 1
        fence()
        if self.reached(wait):
            me[SLEEP] = 0
            return True
        if not self._parked:
            self._parked = True
            self.stats["parks"] += 1
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(min(RECHECK_S, max(0.0, op.deadline - now)), self._on_timer)
        return False

    def _unpark(self) -> None:
        self._parked = False
        self.ctl[self.rank][SLEEP] = 0
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def on_bell(self) -> None:
        if self.held and not self._pumping:  # an XLA call that held the channel has finished (the gate)
            idle = not self.queue
            self.issue_order.admit_held()
            if idle and self.queue:
                self._pump()
        if self._parked:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._pump()

    def _on_timer(self) -> None:
        self._timer = None
        if self.queue and self.queue[0].waiting is not None and self.reached(self.queue[0].waiting):
            self.stats["recheck_hits"] += 1
        self._pump()

    # -- failure and teardown ---------------------------------------------------
    def _resync(self, op: Op[np.ndarray]) -> None:
        """Op ``op`` timed out on every rank (its verdict): leave it and jump my step counter past any step
        of it, to the same number on every rank, so the next op starts in step wherever each rank left
        this one (a late rank's writes for it stay below what the next op waits for)."""
        self._end(op)
        self._release(op)
        if self._parked:
            self._unpark()
        self.publish(op.base + RESYNC_JUMP)
        self.stats["resyncs"] = self.stats.get("resyncs", 0) + 1

    def _break(self, exc: BaseException) -> None:
        if self.native is not None:
            self.native.alarm()  # no native caller may start an op here again
        if self.broken is None:
            self.broken = CommAborted(f"the shared-memory channel is out of step after: {exc}; "
                                      "abort this communicator and create a new one")
        op = self.queue[0] if self.queue else None
        if op is not None:
            self._end(op)
            self._release(op)  # only this rank writes its scratch: it can go back to the pool
        if self._parked:
            self._unpark()

    def on_peer_lost(self, peer: int, exc: BaseException) -> None:
        """World rank ``peer``'s connection ended: if it is one of mine, the running op fails (after one
        last look at the counters)."""
        j = self._index.get(peer)
        if j is None:
            return
        self.lost[j] = exc
        if self.queue and not self._pumping:
            self._pump()

    def on_remote_failure(self, ctx: int, seq: int, exc: BaseException) -> None:
        """A peer gave up op ``seq`` (a failure notice): ours fails with its cause, not at our deadline."""
        if ctx != self.ctx or (self.queue and self.queue[0].seq > seq) or seq in self.remote:
            return  # an op this rank is past already
        if len(self.remote) >= 64:  # bounded: those of ops long past go first
            del self.remote[min(self.remote)]
        self.remote[seq] = exc
        if self.queue and not self._pumping:
            self._pump()

    def fail_all(self, exc: BaseException) -> None:
        self._break(exc)
        self.broken = exc
        while self.queue:
            self.queue.popleft().work._set_exception(exc)
        for held in self.held.values():
            if held is not None:
                held.work._set_exception(exc)
        self.held.clear()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.fail_all(CommAborted("the communicator is closed"))
        if self.on_bell in self.bell.listeners:
            self.bell.listeners.remove(self.on_bell)
        if self.native is not None:
            self.native.close()  # its views of the segments go before the segments
        self.unmap()
