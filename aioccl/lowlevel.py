"""``aioccl.lowlevel``: what aioccl's own integrations use below the public API, and nothing more.

jax_ext (jitted ops run on XLA's threads, natively from C when they can), the torch.distributed backend
and the perf tool need more of a communicator than an application does: which thread runs its engine,
the ops in flight, its native lane and channel, the op an XLA handler started and could not finish, a
Work of their own to complete. They ask here, as trio's integrations ask ``trio.lowlevel``, and never
reach into a ``Communicator``'s or a ``Work``'s private attributes, so this module is the whole of what
they may rely on; it changes only with a note in the CHANGELOG.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .work import Work

if TYPE_CHECKING:
    import numpy as np

    from .communicator import Communicator
    from .engine.op import Op


# -- a communicator's engine and state ------------------------------------------------------------------------
def engine_thread(comm: Communicator) -> int | None:
    """The id of the thread that runs ``comm``'s engine (None before its loop runs)."""
    return comm._engine.placement.thread_id


def on_engine_loop(comm: Communicator) -> bool:
    """Whether the caller runs on ``comm``'s engine loop (its thread, or inside the running loop an inline
    engine shares), where waiting for an op would deadlock."""
    return comm._engine.placement.on_loop_thread()


def on_engine_thread(comm: Communicator) -> bool:
    """Whether the caller is the thread that runs ``comm``'s engine."""
    return comm._engine.placement.thread_id == threading.get_ident()


def in_flight(comm: Communicator) -> set[Work[Any]]:
    """The ops of ``comm`` issued and not yet finished (a copy)."""
    return set(comm._state.inflight)


def is_closed(comm: Communicator) -> bool:
    """Whether ``comm`` takes no more ops (closed or aborted)."""
    return comm._state.closed is not None


def next_seq(comm: Communicator) -> int:
    """The sequence number ``comm``'s next op takes (errors name ops by it)."""
    return comm._seq


def default_timeout(comm: Communicator) -> float:
    """The deadline an op of ``comm`` gets when its call names none, seconds."""
    return comm._state.timeout


def gpu_path(comm: Communicator) -> str | None:
    """How ``comm``'s GPU ops run ('device' or 'staged'), None before its first GPU op."""
    gpu = comm._launcher.gpu
    return gpu.path if gpu is not None else None


def gpu_lane_ran(comm: Communicator) -> int:
    """GPU ops of ``comm`` that the native GPU lane ran from the call to the done Work (0 without a lane)."""
    lane = comm._gpu_lane.native
    return int(lane.ran) if lane is not None else 0


# -- the native core's view of a communicator (jax_ext's XLA handlers) ---------------------------------------
def fast_lane(comm: Communicator) -> Any:
    """``comm``'s native CPU lane (``aioccl.native.core.Lane``: its counters and small all_reduce), or None."""
    return comm._cpu.native


def pair_lane(comm: Communicator) -> Any:
    """``comm``'s native point-to-point lane (``aioccl.native.core.PairLane``, ``lanes/pair.py``), or None."""
    return comm._pair.native


def channel(comm: Communicator) -> Any:
    """``comm``'s shared-memory channel (``engine/shm/channel.py``), or None when its ranks span hosts."""
    return comm._state.shm


def resume_native(comm: Communicator, template: Op[Any], rc: int, seq: int, order: int, inp: np.ndarray,
                  out: np.ndarray) -> Work[Any]:
    """An op a native caller started on ``comm`` (sequence number ``seq``, channel order ``order``) and could
    not finish (``rc``): the engine carries it on, or runs it (``native.core.UNSUITABLE``); ``template`` is
    the op the caller learnt from. Its Work."""
    return comm._cpu.resume_native(template, rc, seq, order, inp, out)


# -- Works an integration completes itself --------------------------------------------------------------------
def new_work(op: str) -> Work[Any]:
    """A started Work of no communicator (an integration's own handle, e.g. several ops waited for as one),
    completed with ``finish``."""
    work: Work[Any] = Work(op, -1)
    work._start()
    return work


def finish(work: Work[Any], result: Any = None, exc: BaseException | None = None) -> None:
    """Complete a Work made by ``new_work``: with ``exc`` when given, else with ``result``."""
    if exc is not None:
        work._set_exception(exc)
    else:
        work._set_result(result)


def mark_retrieved(work: Work[Any]) -> None:
    """The caller was told of ``work``'s outcome another way (an interrupt): it is not reported at exit as
    failed or never awaited."""
    work._retrieved = True


def on_done(work: Work[Any], fn: Callable[[Work[Any]], None]) -> None:
    """``fn(work)`` on whichever thread completes ``work``, or now, here, when it is done (unlike the public
    ``add_done_callback``, which always runs on the engine's thread: for an integration whose own handle
    must complete with the op, on any thread)."""
    work._on_done(fn)


def abandon(work: Work[Any]) -> None:
    """Whoever waited for ``work`` gave up (an interrupt): an op that was never matched is withdrawn, as
    ``Work.wait`` does when it is interrupted."""
    work._abandoned()
