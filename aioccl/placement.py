"""Where the engine's event loop runs: the caller's loop (inline) or a proxy thread.

*Inline* gives async apps the lowest latency: no thread hops at all. The
*proxy thread* owns a private loop, so transfers progress while the caller
computes or blocks (synchronous code, JAX host callbacks on XLA threads,
which must never block the loop that would complete them).

A proxy thread's loop holds the *engine lock* except while it waits in
``select()``. So a thread that issues a small op while the engine is idle
can take the lock and start the op itself (``borrow``): a small collective
over shared memory then runs to its end inside the call, with no hand-over
to the loop and no wake-up back (two trips through the kernel, most of a
small op's cost from synchronous code such as torch's). A busy engine is
never waited for: the op is handed over as before.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from .envvars import env_int

_lent = threading.local()  # .engine: the Placement this thread has borrowed, while it runs an op's start


def lent_here() -> bool:
    """Whether this thread holds a borrowed engine: blocking on an op here would hold up the loop that has to
    finish it (a done callback that waits, run inside the call that borrowed the engine)."""
    return getattr(_lent, "engine", None) is not None


class _LendingSelector:
    """The proxy loop's selector: the engine lock is free exactly while the loop waits for events."""

    def __init__(self, selector: selectors.BaseSelector, lock: threading.Lock) -> None:
        self._selector, self._lock = selector, lock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        self._lock.release()
        try:
            return self._selector.select(timeout)
        finally:
            self._lock.acquire()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._selector, name)


class Placement:
    def __init__(self, loop: asyncio.AbstractEventLoop, thread: threading.Thread | None,
                 lock: threading.Lock | None = None) -> None:
        self.loop = loop
        self.thread = thread
        self.thread_id = thread.ident if thread is not None else threading.get_ident()
        self.lock = lock  # a proxy thread's engine lock (free while its loop is idle)
        self._timers_at_borrow = 0

    @property
    def kind(self) -> str:
        return "thread" if self.thread is not None else "inline"

    @classmethod
    def inline(cls) -> Placement:
        return cls(asyncio.get_running_loop(), None)

    @classmethod
    def proxy_thread(cls) -> Placement:
        share_the_gil()
        ready = threading.Event()
        box: dict[str, asyncio.AbstractEventLoop] = {}
        lock = threading.Lock()

        def main() -> None:
            lock.acquire()
            loop = asyncio.SelectorEventLoop(_LendingSelector(selectors.DefaultSelector(), lock))  # type: ignore[arg-type]
            box["loop"] = loop
            asyncio.set_event_loop(loop)
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()
                lock.release()

        thread = threading.Thread(target=main, name="aioccl-proxy", daemon=True)
        thread.start()
        ready.wait()
        p = cls(box["loop"], thread, lock)
        p.thread_id = thread.ident or 0
        return p

    def on_loop_thread(self) -> bool:
        return threading.get_ident() == self.thread_id

    def borrow(self) -> bool:
        """From a thread other than the loop's: take the idle engine (True), to run an op's start here as the
        loop would; False at once when the loop is busy (or inline, or closed). Pair with ``give_back``."""
        if self.lock is None or self.loop.is_closed() or not self.lock.acquire(blocking=False):
            return False
        self._timers_at_borrow = len(getattr(self.loop, "_scheduled", ()))
        _lent.engine = self
        return True

    def give_back(self, busy: bool) -> None:
        """Return the borrowed engine; ``busy``: something was left for the loop (a parked op, a timer, a
        callback), so it is woken to look."""
        lock = self.lock
        assert lock is not None
        ready, timers = getattr(self.loop, "_ready", None), getattr(self.loop, "_scheduled", None)  # CPython's
        _lent.engine = None
        lock.release()
        if busy or ready or timers is None or len(timers) != self._timers_at_borrow:
            self.call(_nothing)

    def wake(self) -> None:
        """Have the loop look at what a borrower left it (the native lane's callers, ``lanes/pair.py``)."""
        self.call(_nothing)

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the engine loop soon, from any thread."""
        if self.on_loop_thread():
            self.loop.call_soon(fn, *args)
        elif not self.loop.is_closed():
            self.loop.call_soon_threadsafe(fn, *args)

    def stop(self, join: bool = True) -> None:
        """Stop the proxy thread's loop (no-op inline); ``join`` waits for the thread to end."""
        if self.thread is not None and not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(self.loop.stop)
            except RuntimeError:  # closed meanwhile by the thread itself
                return
            if join and threading.current_thread() is not self.thread:
                self.thread.join(timeout=10)


DEFAULT_GIL_SWITCH_US = 200


def share_the_gil(env: Mapping[str, str] = os.environ) -> None:
    """A proxy thread needs the GIL for every step of an op; while the main thread runs Python, it gets it
    only when the interpreter makes the main thread switch, every ``sys.getswitchinterval()`` (5 ms by
    default): a 1 MiB all_reduce then took 12 times longer beside a busy loop. ``AIOCCL_GIL_SWITCH_US``
    (200) lowers the interval to that, never raises it; the switch happens only while another thread asks
    for the GIL, so a program whose engine is idle pays nothing. 0 leaves the interpreter's setting."""
    us = env_int(env, "AIOCCL_GIL_SWITCH_US", DEFAULT_GIL_SWITCH_US, 0, 1_000_000)
    if us and sys.getswitchinterval() > us * 1e-6:
        sys.setswitchinterval(us * 1e-6)


def _nothing() -> None:
    return None
