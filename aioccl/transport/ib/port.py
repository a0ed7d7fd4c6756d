"""One opened RDMA device per engine: its regions, and the completion queue driven by the event loop.

Completions are event-driven, as in any verbs program that does not spin:
the completion channel's fd is registered with ``loop.add_reader``; when it
turns readable we *re-arm first, then drain* the CQ, so a completion that
lands between the two still raises the next event. A periodic safety poll
(``SAFETY_POLL_S``) drains anyway, so a lost notification costs at most
that long, never a hang. Completions carry the connection's number in their
``wr_id`` and are handed to that connection.
"""

from __future__ import annotations

import asyncio
import bisect
import threading
from typing import Protocol

from ... import log
from ..shm.segment import stop_reader
from .protocol import split_wr_id
from .verbs import Completion, Device, Region

_log = log.get("NET")
SAFETY_POLL_S = 0.05
POLL_BUDGET = 256


class Handler(Protocol):
    def on_completion(self, kind: int, index: int, c: Completion) -> None: ...
    def after_drain(self) -> None: ...


class Port:
    def __init__(self, device: Device, loop: asyncio.AbstractEventLoop) -> None:
        self.device, self.loop = device, loop
        self.handlers: dict[int, Handler] = {}
        self._starts: list[int] = []  # registered regions, sorted by address (for zero-copy lookups)
        self._regions: list[Region] = []
        self._mem_lock = threading.Lock()  # comm.alloc registers from the caller's thread
        self._timer: asyncio.TimerHandle | None = None
        self._watching = False
        self.closed = False

    def start(self) -> None:
        self.device.arm()
        self.loop.add_reader(self.device.fileno(), self._on_event)
        self._watching = True
        self._timer = self.loop.call_later(SAFETY_POLL_S, self._safety_poll)

    # -- memory ----------------------------------------------------------------
    def register(self, addr: int, length: int) -> Region:
        with self._mem_lock:
            r = self.device.register(addr, length)
            i = bisect.bisect(self._starts, r.addr)
            self._starts.insert(i, r.addr)
            self._regions.insert(i, r)
            return r

    def deregister(self, region: Region) -> None:
        with self._mem_lock:
            if region in self._regions and not self.closed:
                i = self._regions.index(region)
                del self._regions[i], self._starts[i]
                self.device.deregister(region)

    def find(self, addr: int, nbytes: int) -> Region | None:
        """The registered region holding ``[addr, addr + nbytes)``, if any (then sends skip the staging copy)."""
        with self._mem_lock:
            i = bisect.bisect(self._starts, addr) - 1
            if i >= 0 and self._regions[i].contains(addr, nbytes):
                return self._regions[i]
            return None

    # -- completions -------------------------------------------------------------
    def _on_event(self) -> None:
        self.device.arm()
        self.drain()

    def _safety_poll(self) -> None:
        if not self.closed:
            self.drain()
            self._timer = self.loop.call_later(SAFETY_POLL_S, self._safety_poll)

    def drain(self) -> None:
        touched: dict[int, Handler] = {}
        while not self.closed:
            batch = self.device.poll(POLL_BUDGET)
            for c in batch:
                conn, kind, index = split_wr_id(c.wr_id)
                h = self.handlers.get(conn)
                if h is None:
                    if c.error is not None:
                        _log.debug("completion error on closed connection %d: %s", conn, c.error)
                    continue
                h.on_completion(kind, index, c)
                touched[conn] = h
            if len(batch) < POLL_BUDGET:
                break
        for h in touched.values():
            h.after_drain()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        if self._watching:
            self._watching = False
            stop_reader(self.loop, self.device.fileno())
        with self._mem_lock:
            self._regions.clear()
            self._starts.clear()
            self.device.close()  # deregisters whatever is still registered
