"""The stand-in's GPU: every stream's copies and kernels run late, in stream order, on one worker thread.

A real GPU runs what the host enqueued some time after the call returned.
A host program that forgets that (reads a buffer before its event, reuses a
staging buffer while a copy is still queued, signals completion before the
results land, orders its work on the wrong stream) works by luck on a
synchronous stand-in. Here each enqueued item becomes ready
``FAKECUPY_DELAY_MS`` x U(0.5, 1.5) after it was enqueued (default 0.5 ms)
and runs only when every earlier item on its stream has run, so such a
program reads stale or poisoned bytes, as it would on a GPU.

Streams are queues keyed by their handle. The legacy default stream (handle
0) keeps CUDA's implicit ordering with *blocking* streams (``Stream()``):
work on either waits for what the other already had queued; non-blocking
streams (``Stream(non_blocking=True)``, and external handles such as XLA's)
are ordered with nothing but their own queue and explicit event waits.
"""

from __future__ import annotations

import atexit
import os
import random
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

WAIT_LIMIT_S = 120.0  # a host wait this long means the program hung its own stream: fail loudly instead


def delay_s() -> float:
    return float(os.environ.get("FAKECUPY_DELAY_MS", "0.5")) / 1000.0


@dataclass(slots=True)
class Item:
    seq: int
    ready_at: float
    fn: Callable[[], None] | None  # None: a marker (an event record, a wait)
    deps: list[tuple[Queue, int]] = field(default_factory=list)  # (queue, seq) that must have run first
    until: Callable[[], bool] | None = None  # a stream wait on memory: ready once this holds (polled)


class Queue:
    """One CUDA stream: items run in order; ``done_seq`` is the last one that has run."""

    __slots__ = ("ptr", "blocking", "items", "next_seq", "done_seq")

    def __init__(self, ptr: int, blocking: bool) -> None:
        self.ptr, self.blocking = ptr, blocking
        self.items: deque[Item] = deque()
        self.next_seq = 0
        self.done_seq = -1

    @property
    def last(self) -> int:
        return self.next_seq - 1


class FakeGpuError(RuntimeError):
    """Work on the stand-in's GPU raised: every later synchronization reports it, as a sticky CUDA error."""


class Gpu:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.queues: dict[int, Queue] = {0: Queue(0, True)}
        self.delay = delay_s()
        self.rng = random.Random(os.getpid())
        self.error: str | None = None
        self._thread: threading.Thread | None = None
        self._kept: list[object] = []  # device memory the host dropped: freed once no work is queued

    def keep(self, memory: object) -> None:
        """Hold ``memory`` until the GPU is idle. cupy's pool never hands memory to the C heap while a stream
        may still write it; without this, a late write into an array the host dropped corrupts the process's
        heap instead of showing up as wrong bytes."""
        with self.cond:
            self._kept.append(memory)

    def queue(self, ptr: int, blocking: bool = False) -> Queue:
        """The queue for stream handle ``ptr`` (made on first sight: an external handle is non-blocking)."""
        with self.cond:
            q = self.queues.get(ptr)
            if q is None:
                q = self.queues[ptr] = Queue(ptr, blocking)
            return q

    def submit(self, ptr: int, fn: Callable[[], None] | None, deps: list[tuple[Queue, int]] | None = None,
               after_s: float | None = None, until: Callable[[], bool] | None = None) -> tuple[Queue, int]:
        """Enqueue ``fn`` on stream ``ptr``; ``(queue, seq)`` names it for events and waits. ``after_s``: ready
        exactly that late (a long kernel, for tests that need one stream well behind another)."""
        with self.cond:
            q = self.queue(ptr)
            need = list(deps or [])
            if q.ptr == 0:  # the legacy stream waits for the blocking streams' queued work ...
                need += [(b, b.last) for b in self.queues.values() if b.blocking and b.ptr != 0 and b.done_seq < b.last]
            elif q.blocking:  # ... and they wait for its
                null = self.queues[0]
                if null.done_seq < null.last:
                    need.append((null, null.last))
            seq = q.next_seq
            q.next_seq += 1
            delay = self.delay * (0.5 + self.rng.random()) if after_s is None else after_s
            q.items.append(Item(seq, time.monotonic() + delay, fn, need, until))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fakecupy-gpu", daemon=True)
                self._thread.start()
            self.cond.notify_all()
            return q, seq

    def done(self, q: Queue, seq: int) -> bool:
        self._raise_sticky()
        return q.done_seq >= seq

    def wait(self, q: Queue, seq: int) -> None:
        """Block the calling host thread until item ``seq`` of ``q`` has run."""
        deadline = time.monotonic() + WAIT_LIMIT_S
        with self.cond:
            while q.done_seq < seq:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise FakeGpuError(f"fakecupy: waited {WAIT_LIMIT_S:.0f}s for stream {q.ptr} item {seq} "
                                       f"(done up to {q.done_seq}): its stream waits for something never recorded")
                self.cond.wait(min(left, 1.0))
        self._raise_sticky()

    def synchronize_stream(self, ptr: int) -> None:
        q = self.queue(ptr)
        self.wait(q, q.last)

    def synchronize(self) -> None:
        """Every stream, as ``cudaDeviceSynchronize`` (and the implicit one in ``cudaFree``)."""
        with self.cond:
            pending = [(q, q.last) for q in self.queues.values()]
        for q, seq in pending:
            self.wait(q, seq)

    def _raise_sticky(self) -> None:
        if self.error is not None:
            raise FakeGpuError(f"fakecupy: work on the GPU failed earlier: {self.error}")

    def _pick(self, now: float) -> tuple[Queue | None, Item | None, float]:
        """The ready head that became ready first, or how long until one may be."""
        best: tuple[Queue, Item] | None = None
        wake = 1.0
        for q in self.queues.values():
            if not q.items:
                continue
            head = q.items[0]
            if any(dq.done_seq < ds for dq, ds in head.deps):
                continue
            if head.ready_at > now:
                wake = min(wake, head.ready_at - now)
                continue
            if head.until is not None and not head.until():
                wake = min(wake, 0.0002)  # the GPU polls the word; other streams run meanwhile
                continue
            if best is None or head.ready_at < best[1].ready_at:
                best = (q, head)
        return (best[0], best[1], 0.0) if best else (None, None, wake)

    def _run(self) -> None:
        while True:
            with self.cond:
                while True:
                    q, item, wake = self._pick(time.monotonic())
                    if item is not None:
                        break
                    self.cond.wait(wake)
            if item.fn is not None:
                try:
                    item.fn()
                except BaseException as e:  # noqa: BLE001 - a faulting kernel: sticky, reported at the next sync
                    self.error = f"{type(e).__name__}: {e}"
                    traceback.print_exc(file=sys.stderr)
            with self.cond:
                assert q is not None
                q.items.popleft()
                q.done_seq = item.seq
                if self._kept and not any(x.items for x in self.queues.values()):
                    self._kept = []
                self.cond.notify_all()


GPU = Gpu()


@atexit.register
def _drain() -> None:
    """Let queued device work finish before the interpreter (and the memory it writes) goes away."""
    try:
        GPU.synchronize()
    except FakeGpuError as e:
        print(e, file=sys.stderr)
