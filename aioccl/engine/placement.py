"""Where the engine's event loop runs: the caller's loop (inline) or a proxy thread.

*Inline* gives async apps the lowest latency: no thread hops at all. The
*proxy thread* owns a private loop, so transfers progress while the caller
computes or blocks (synchronous code, JAX host callbacks on XLA threads,
which must never block the loop that would complete them).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any


class Placement:
    def __init__(self, loop: asyncio.AbstractEventLoop, thread: threading.Thread | None) -> None:
        self.loop = loop
        self.thread = thread
        self.thread_id = thread.ident if thread is not None else threading.get_ident()

    @property
    def kind(self) -> str:
        return "thread" if self.thread is not None else "inline"

    @classmethod
    def inline(cls) -> Placement:
        return cls(asyncio.get_running_loop(), None)

    @classmethod
    def proxy_thread(cls) -> Placement:
        ready = threading.Event()
        box: dict[str, asyncio.AbstractEventLoop] = {}

        def main() -> None:
            loop = asyncio.new_event_loop()
            box["loop"] = loop
            asyncio.set_event_loop(loop)
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        thread = threading.Thread(target=main, name="aioccl-proxy", daemon=True)
        thread.start()
        ready.wait()
        p = cls(box["loop"], thread)
        p.thread_id = thread.ident or 0
        return p

    def on_loop_thread(self) -> bool:
        return threading.get_ident() == self.thread_id

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
