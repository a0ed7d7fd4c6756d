"""The stand-in's streams run late: each careless host pattern gets wrong bytes, its careful twin right ones.

    FAKECUPY_DELAY_MS=5 PYTHONPATH=tests/fakecupy python late_streams.py

Run by ``tests/test_gpu.py`` (fakecupy only: on a GPU the careless lines are races, not certainties).
Prints one ``<case> careless=<wrong|right> careful=<wrong|right>`` line per case.
"""

from __future__ import annotations

import ctypes

import cupy as cp
import numpy as np
from cupy.cuda._gpu import GPU

D2H, H2D = 2, 1
WANT = np.arange(1, 9, dtype=np.int32)
rt = cp.cuda.runtime


def verdict(got: np.ndarray, want: np.ndarray = WANT) -> str:
    return "right" if np.array_equal(got, want) else "wrong"


def pinned(n: int) -> tuple[int, np.ndarray]:
    ptr = rt.hostAlloc(n * 4, 0)
    return ptr, np.frombuffer((ctypes.c_char * (n * 4)).from_address(ptr), dtype=np.int32)


def missing_wait_on_the_producers_stream(careful: bool) -> str:
    a, b = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    GPU.submit(a.ptr, None, after_s=0.05)  # a long kernel: the producer's stream runs well behind
    with a:
        x = cp.asarray(WANT)
    y = cp.empty(8, np.int32)
    if careful:
        b.wait_event(a.record())
    with b:
        y[...] = x
    b.synchronize()
    return verdict(y.get(stream=b))


def reading_a_host_buffer_before_its_event(careful: bool) -> str:
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        x = cp.asarray(WANT)
    ptr, host = pinned(8)
    host[...] = 0
    rt.memcpyAsync(ptr, x.data.ptr, 32, D2H, s.ptr)
    ev = s.record()
    if careful:
        ev.synchronize()
    got = host.copy()
    s.synchronize()
    rt.freeHost(ptr)
    return verdict(got)


def reusing_a_pinned_buffer_while_its_copy_is_queued(careful: bool) -> str:
    s = cp.cuda.Stream(non_blocking=True)
    y = cp.empty(8, np.int32)
    ptr, host = pinned(8)
    host[...] = WANT
    rt.memcpyAsync(y.data.ptr, ptr, 32, H2D, s.ptr)
    ev = s.record()
    if careful:
        ev.synchronize()
    host[...] = -1  # the next op's bytes
    s.synchronize()
    rt.freeHost(ptr)
    return verdict(y.get(stream=s))


def completing_before_the_results_land(careful: bool) -> str:
    s = cp.cuda.Stream(non_blocking=True)
    y = cp.empty(8, np.int32)
    GPU.submit(s.ptr, None, after_s=0.05)
    with s:
        y.set(WANT)
    if careful:
        s.record().synchronize()
    return verdict(y.get())  # on the default stream, which does not wait for a non-blocking one


def default_stream_read_after_a_non_blocking_writer(careful: bool) -> str:
    """Careful: the writer is a blocking stream, which CUDA orders with the legacy default stream."""
    s = cp.cuda.Stream(non_blocking=not careful)
    y = cp.empty(8, np.int32)
    GPU.submit(s.ptr, None, after_s=0.05)
    with s:
        y.set(WANT)
    return verdict(y.get())


def stream_order_is_kept(careful: bool) -> str:
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        # made on s too: zeros on the default stream, which a non-blocking stream does not wait for, could land
        # after the writes below (the stand-in runs each stream late), and read wrong once in a while under load
        y = cp.zeros(8, np.int32)
        for k in range(1, 9):
            y[k - 1:] = cp.asarray(WANT[k - 1:]) if k == 8 else cp.asarray(np.full(9 - k, k, np.int32))
        y[:] = cp.asarray(WANT)
    return verdict(y.get(stream=s))


for case in (missing_wait_on_the_producers_stream, reading_a_host_buffer_before_its_event,
             reusing_a_pinned_buffer_while_its_copy_is_queued, completing_before_the_results_land,
             default_stream_read_after_a_non_blocking_writer,
             stream_order_is_kept):
    print(f"{case.__name__} careless={case(False)} careful={case(True)}", flush=True)
