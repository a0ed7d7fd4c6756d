"""A host callback interrupted in its wait leaves nothing of its op in XLA's buffers.

A signal handler that raises (Ctrl-C's ``KeyboardInterrupt``) runs on the main thread, inside
whatever Python code runs there: when XLA runs a host callback on the main thread, that is the
callback's ``wait()``. The callback then raises, XLA fails the computation and frees or reuses its
buffers, but the op goes on in the engine, and would write its result (or let a peer read its input
in place) in memory that is no longer the op's: a heap corrupted some time later, a peer's wrong sum.

So on the main thread a small op runs on buffers of its own: the inputs are copied in first and the
outputs copied back only once every op of the call succeeded. Interrupted, it withdraws what no peer
has seen (an unmatched receive, which would otherwise take the next call's message) and lets the rest
run on to its end on its own buffers, keeping the communicator in step with the peers. A large op
(past ``COPY_LIMIT``, where two copies would cost more than a thread hop) runs on XLA's buffers on a
helper thread instead, which no signal reaches: the main thread waits for it and holds an interrupt
until the op has ended (withdrawing an unmatched receive at once, so that wait is short). Other
threads never see a signal, so callbacks there work on XLA's buffers directly.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from aioccl import Communicator

RunFn = Any  # run(comm, ins, outs, same, **params)
COPY_LIMIT = 1 << 20  # bytes of a call's buffers up to which the main thread copies rather than hops
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def run_guarded(run: RunFn, comm: Communicator, ins: list[Any], outs: list[Any], same: bool,
                **params: Any) -> None:
    """``run(comm, ins, outs, same, **params)`` such that an interrupt leaves ``ins`` and ``outs`` alone."""
    if threading.current_thread() is not threading.main_thread() or not all(
            isinstance(a, np.ndarray) for a in (*ins, *outs)):
        run(comm, ins, outs, same, **params)  # no signal reaches this thread (GPU views stay on the stream)
        return
    before = set(comm._inflight)
    if sum(a.nbytes for a in (*ins, *outs)) > COPY_LIMIT:
        _run_beside(run, comm, ins, outs, same, before, **params)
        return
    own_in = [np.array(a, copy=True) for a in ins]
    own_out = [own_in[0] if same and k == 0 else np.empty_like(o) for k, o in enumerate(outs)]
    try:
        run(comm, own_in, own_out, same, **params)
    except BaseException as e:
        if not isinstance(e, Exception):  # an interrupt (a signal), not the op's own failure
            withdraw_new(comm, before)
        raise
    for o, mine in zip(outs, own_out, strict=True):
        np.copyto(o, mine)


def _run_beside(run: RunFn, comm: Communicator, ins: list[Any], outs: list[Any], same: bool, before: set[Any],
                **params: Any) -> None:
    """``run`` on XLA's buffers on a helper thread; an interrupt of the main thread's wait is raised once the
    call's ops have ended (an unmatched receive withdrawn at once)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(4, thread_name_prefix="aioccl-jax-guard")
    fut = _pool.submit(run, comm, ins, outs, same, **params)
    interrupt: BaseException | None = None
    while True:
        try:
            fut.result()
            break
        except BaseException as e:
            if fut.done():  # the op's own outcome (an error); an interrupt before it is what the caller sees
                if interrupt is not None:
                    raise interrupt from None
                raise
            if interrupt is None:  # held until the op has ended: XLA frees its buffers once we return
                interrupt = e
                withdraw_new(comm, before)
    if interrupt is not None:
        raise interrupt


def withdraw_new(comm: Communicator, before: set[Any]) -> None:
    """The ops this call issued: an unmatched receive is withdrawn, the rest run on (on their own buffers),
    none reported at exit as never awaited (the app was told, by the interrupt)."""
    for w in set(comm._inflight) - before:
        w.cancel("when the host callback waiting for it was interrupted")
        w._retrieved = True
