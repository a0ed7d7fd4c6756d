"""Admission at a listening socket: what a flood of strangers may cost (nothing a real peer needs).

Every listening socket aioccl opens (the root's, each rank's bootstrap acceptor,
through which data connections, their stripe sockets and shared-memory side channels come)
admits connections the same way:

- a stranger must send its first bytes (the answer to our challenge) within
  ``FIRST_BYTES_S``, and finish the handshake within ``HANDSHAKE_S``;
- at most ``limit`` connections are in the handshake at once. When one more
  arrives, the *oldest* unauthenticated one is evicted, not the newcomer.
  A real peer answers in about a millisecond, so under a flood it is almost
  never the oldest, while refusing newcomers (the earlier policy) refused the
  real peers along with the flood; a real peer evicted anyway retries (its
  dialer backs off and tries again until its own deadline);
- a connection that proved the secret is never evicted: a flood cannot
  produce one;
- drops are logged as they happen for the first few, then as one summary line
  per ``SUMMARY_S`` with counts by reason and source, so a flood cannot fill
  the log either.

So file descriptors and memory stay bounded by ``limit`` whatever arrives.
Measured on a 2-core machine against ``scripts/flood.py``: docs/troubleshooting.md.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import Counter
from typing import Any

from .auth import AuthError

FIRST_BYTES_S = 3.0  # a stranger that says nothing for this long is dropped
HANDSHAKE_S = 10.0  # the whole handshake and hello, for one that did speak
LOGGED_ONE_BY_ONE = 8  # drops logged with their own line before summaries take over
SUMMARY_S = 10.0


def source(peer: Any) -> str:
    return str(peer[0]) if isinstance(peer, tuple) and peer else str(peer)


def reason_of(e: BaseException) -> str:
    """A dropped connection's reason, in the few words a summary line counts."""
    if isinstance(e, TimeoutError):
        return "too slow"
    if isinstance(e, AuthError):
        return "not aioccl"
    return "closed" if isinstance(e, OSError) else "bad hello"


class DropLog:
    """The first few drops one line each (with the address), then one summary line per ``SUMMARY_S``."""

    def __init__(self, logger: logging.Logger, who: str) -> None:
        self.logger, self.who = logger, who
        self.total = 0
        self._reasons: Counter[str] = Counter()
        self._sources: Counter[str] = Counter()
        self._since = time.monotonic()

    def drop(self, peer: Any, reason: str, detail: str = "") -> None:
        self.total += 1
        if self.total <= LOGGED_ONE_BY_ONE:
            self.logger.warning("%s: dropped connection from %s: %s", self.who, peer, detail or reason)
            if self.total == LOGGED_ONE_BY_ONE:
                self.logger.warning("%s: further drops are counted and summarised every %gs", self.who, SUMMARY_S)
            return
        self._reasons[reason] += 1
        if len(self._sources) < 16 or source(peer) in self._sources:  # bounded, whatever comes
            self._sources[source(peer)] += 1
        if time.monotonic() - self._since >= SUMMARY_S:
            self.flush()

    def flush(self) -> None:
        n = sum(self._reasons.values())
        if n:
            reasons = ", ".join(f"{k} {v}" for k, v in self._reasons.most_common())
            sources = ", ".join(f"{k} ({v}x)" for k, v in self._sources.most_common(4))
            self.logger.warning("%s: dropped %d more connections in %.0fs (%s) from %s; %d in all", self.who, n,
                                time.monotonic() - self._since, reasons, sources, self.total)
        self._reasons.clear()
        self._sources.clear()
        self._since = time.monotonic()


class Admission:
    """The connections in the handshake at one listening socket, oldest first, at most ``limit``."""

    def __init__(self, limit: int, drops: DropLog) -> None:
        self.limit, self.drops = limit, drops
        self.evicted = 0
        self._unproven: dict[asyncio.Task[None], Any] = {}  # insertion order is age
        self._all: set[asyncio.Task[None]] = set()

    def admit(self, task: asyncio.Task[None], conn: socket.socket, peer: Any) -> None:
        """Track a new connection's handshake task, evicting the oldest unproven one if at the limit.

        A task cancelled before it ever ran never reaches its own ``finally``: its socket is closed here
        then (under a flood most evictions are of such tasks; without this their fds waited for the GC)."""
        while len(self._unproven) >= self.limit:
            oldest, who = next(iter(self._unproven.items()))
            del self._unproven[oldest]
            self.evicted += 1
            oldest.cancel()  # its handler closes the socket
            self.drops.drop(who, "evicted", "evicted unauthenticated (the handshake queue is full)")
        self._unproven[task] = peer
        self._all.add(task)
        task.add_done_callback(self._done)
        task.add_done_callback(lambda t: conn.close() if t.cancelled() else None)

    def proven(self, task: asyncio.Task[None] | None) -> None:
        """The connection proved the secret: it is never evicted now."""
        if task is not None:
            self._unproven.pop(task, None)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._unproven.pop(task, None)
        self._all.discard(task)

    def __len__(self) -> int:
        return len(self._all)

    def cancel_all(self) -> None:
        for t in list(self._all):
            t.cancel()


async def accept_forever(listener: socket.socket, admission: Admission, handle: Any) -> None:
    """Accept from ``listener`` until cancelled, each connection handled by ``handle(conn, peer)`` under
    ``admission``. A failed accept (out of fds: EMFILE) is logged and retried after 50 ms, not in a hot loop.

    One accept per loop turn: ``sock_accept`` returns without yielding while the backlog has more, so under
    a flood a loop that did not yield here accepted (and evicted) without end while the evicted handlers
    never got the turn that closes their sockets (measured: 1,600 fds held at a root bounded to 256). The
    kernel's backlog holds the rest, and a real peer whose connection it drops dials again."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            conn, peer = await loop.sock_accept(listener)
        except OSError as e:
            admission.drops.drop("?", "accept failed", f"accept failed: {e}")
            await asyncio.sleep(0.05)
            continue
        admission.admit(loop.create_task(handle(conn, peer)), conn, peer)
        await asyncio.sleep(0)
