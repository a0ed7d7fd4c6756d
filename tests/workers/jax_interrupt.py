"""Interrupting a jitted jax_ext op at random points, as Ctrl-C does (issue 45 item 9).

Rank 0 arms a timer whose handler raises KeyboardInterrupt at a random moment around each op while
rank 1 joins it a random moment late, so the interrupt lands before the op is issued, inside the host
callback's wait, or after. Whatever it hits: rank 0 lives on (no write into memory XLA freed: freed
and reused buffers are checked), rank 1 never gets a wrong result, and the next op is exact on both.
Prints ``JAXI OK <ops> <interrupted> <inside>`` (inside: interrupts XLA reported from the callback).
"""

from __future__ import annotations

import random
import signal
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_ext

ITERS = int(sys.argv[1]) if len(sys.argv) > 1 else 40
comm = jax_ext.default_comm()
r = comm.rank
# above the native core's size: every call goes through Python on the main thread (jax >= 0.12), where a
# signal lands; the reduce's buffers are copied (interrupts.COPY_LIMIT), the gather's run beside
N = 1 << 17
rng = random.Random(1234 + r)
reduce = jax.jit(lambda x: jax_ext.all_reduce(x * 1.0))
gather = jax.jit(lambda x: jax_ext.all_gather(x + 0.0))
import threading  # noqa: E402

import jax_ext._primitive as _primitive  # noqa: E402
import jax_ext.native_call as _native_call  # noqa: E402

threads: set[str] = set()
guarded = _primitive.run_guarded


def spy(*args: object, **kwargs: object) -> None:
    threads.add(threading.current_thread().name)
    guarded(*args, **kwargs)


_primitive.run_guarded = _native_call.run_guarded = spy  # (the host callback's, the custom call's fallback)
reduce(jnp.ones(N)).block_until_ready()
gather(jnp.ones(N)).block_until_ready()
_primitive.run_guarded = _native_call.run_guarded = guarded
if threads != {"MainThread"}:  # a signal reaches only the main thread: nothing here for it to interrupt
    print(f"JAXI SKIP this jax runs host callbacks on {sorted(threads)}, not the main thread", flush=True)
    sys.exit(0)


def interrupt(_sig: int, _frame: object) -> None:
    raise KeyboardInterrupt("the test's timer")


signal.signal(signal.SIGALRM, interrupt)
ops = interrupted = inside = 0
for it in range(ITERS):
    x = jnp.full(N, float(r + 1 + it))
    want_sum = float(3 + 2 * it)
    fn, kind = (reduce, "sum") if it % 2 == 0 else (gather, "gather")
    if r == 0:
        seq = comm._seq
        signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.0005, 0.06))
        try:
            y = fn(x)
            y.block_until_ready()
            signal.setitimer(signal.ITIMER_REAL, 0)
        except (KeyboardInterrupt, jax.errors.JaxRuntimeError) as e:
            signal.setitimer(signal.ITIMER_REAL, 0)
            interrupted += 1
            if isinstance(e, jax.errors.JaxRuntimeError):
                assert "KeyboardInterrupt" in str(e), str(e)[-2000:]
                inside += 1
            jax.effects_barrier()  # what was dispatched has run (or failed) by now ...
            waited = time.monotonic() + 3.0  # ... or is about to: an interrupt in the dispatch itself can leave
            while comm._seq == seq and time.monotonic() < waited:  # its computation queued but not yet run
                time.sleep(0.01)
            if comm._seq == seq:  # interrupted before the op was issued: issue it, to stay in step
                fn(x).block_until_ready()
        junk = [np.full(N, 7.0) + i for i in range(8)]  # reuse what XLA freed
        time.sleep(0.07)  # the interrupted op finishes on its own buffers meanwhile
        assert all(bool((j == 7.0 + i).all()) for i, j in enumerate(junk)), "a freed buffer was written"
    else:
        time.sleep(rng.uniform(0.0, 0.05))
        y = np.asarray(fn(x)).reshape(-1)
        if kind == "sum":
            assert (y == want_sum).all(), (it, y[:4])
        else:
            assert (y[:N] == 1 + it).all() and (y[N:] == 2 + it).all(), (it, y[:4], y[N:N + 4])
    ops += 1
    z = np.asarray(reduce(jnp.full(N, float(r + 1))))  # in step: the next op is exact everywhere
    assert (z == 3.0).all(), (it, z[:4])
print(f"JAXI OK {ops} {interrupted} {inside}", flush=True)
