"""What the engine's parts use of the engine: one Protocol, so that no part imports ``engine.py``.

``engine.py`` assembles the parts (mailbox, executor, point-to-point, probes, backpressure, rendezvous,
the shared-memory channel's set-up) and each part is handed the engine to work with. Were the parts to
name ``Engine`` itself, every part would import the module that imports it: one circle of every file in
this folder. They name ``EngineServices`` instead; ``Engine`` provides it (mypy checks that wherever an
``Engine`` is passed), and the parts stand below the assembly, as asyncio's transports stand below
the loop that drives them.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from ..bootstrap.mesh import Table
    from ..placement import Placement
    from ..transport.shm.segment import LoopBell
    from .mailbox import Mailbox
    from .op import Op
    from .p2p.backpressure import SendQueue
    from .p2p.put_off import Waiting
    from .pool import BufferPool
    from .view import CommView


class EngineServices(Protocol):
    """The engine as its parts see it: its loop, mailbox, connections and the means to send."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def placement(self) -> Placement: ...

    @property
    def rank(self) -> int: ...

    @property
    def aborted(self) -> BaseException | None: ...

    @property
    def mailbox(self) -> Mailbox: ...

    @property
    def conns(self) -> dict[int, Any]: ...  # world rank -> its connection (tcp, self, ib or shm pair)

    @property
    def pool(self) -> BufferPool: ...

    @property
    def table(self) -> Table | None: ...

    @property
    def queued_sends(self) -> dict[int, int]: ...

    @property
    def put_off(self) -> dict[int, Waiting]: ...

    @property
    def send_queue(self) -> SendQueue: ...

    @property
    def timers(self) -> set[asyncio.TimerHandle]: ...

    @property
    def net_spin_s(self) -> float: ...

    @property
    def eager(self) -> int: ...

    async def send(self, peer: int, header: bytes, payload: memoryview | None) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...

    async def run_collective(self, comm: CommView, op: Op[Any]) -> None: ...

    def channel_bell(self) -> LoopBell: ...

    def attach_channel(self, chan: Any, view: CommView) -> None: ...
