"""Backpressure for point-to-point sends: ``comm.drain()``, as asyncio's ``StreamWriter.drain()``.

``isend`` never waits for its receive: it returns a Work once its message is handed to the transport
or queued, and a send the transport cannot take now (a full ring or socket, a receiver whose budget for
unexpected messages is spent, a rendezvous waiting for its receive) waits in the engine holding its
payload. (One exception keeps a stream's order cheap: a same-host send through the native lane that finds
its FIFO full waits in the call for room while the receiver keeps taking and the event loop has nothing
else to run: ``native/src/py/pair_room.c``.) An app that issues sends faster than a peer takes
them would hold ever more. The engine counts, per peer, the bytes of sends issued and not yet handed
to the transport; ``drain`` is done once that count is at most ``AIOCCL_SEND_QUEUE`` (4 MiB) for its
peer (or every peer), so ``isend`` then ``await comm.drain(peer)`` bounds what a sender holds, as
``write`` then ``await drain()`` does on a stream. Sends that went at once (the common, small case)
are never counted: draining costs nothing while the peer keeps up.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping

from ...envvars import env_int

DEFAULT_SEND_QUEUE = 4 << 20


def send_queue_limit(env: Mapping[str, str] = os.environ) -> int:
    """``AIOCCL_SEND_QUEUE``: per peer, the bytes of queued sends at which ``drain()`` waits."""
    return env_int(env, "AIOCCL_SEND_QUEUE", DEFAULT_SEND_QUEUE, 0, 1 << 40)


class SendQueue:
    """Per world peer, the bytes of sends issued and not yet handed to the transport; who waits on them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bytes: dict[int, int] = {}
        self._waiters: list[tuple[tuple[int, ...], asyncio.Future[None]]] = []

    def add(self, world: int, nbytes: int) -> None:
        self.bytes[world] = self.bytes.get(world, 0) + nbytes

    def done(self, world: int, nbytes: int) -> None:
        left = self.bytes.get(world, 0) - nbytes
        if left > 0:
            self.bytes[world] = left
        else:
            self.bytes.pop(world, None)
        if self._waiters:
            keep = []
            for peers, fut in self._waiters:
                if fut.done():
                    continue
                if self.over(peers):
                    keep.append((peers, fut))
                else:
                    fut.set_result(None)
            self._waiters = keep

    def over(self, peers: tuple[int, ...]) -> list[int]:
        """The peers (world ranks) whose queued bytes exceed the limit."""
        return [w for w in peers if self.bytes.get(w, 0) > self.limit]

    def wait(self, peers: tuple[int, ...], fut: asyncio.Future[None]) -> None:
        self._waiters.append((peers, fut))
