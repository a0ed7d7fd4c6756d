"""What a transport's set-up is given to connect one rank to its peers: a record, never the engine.

Each transport below the engine brings its pairs up over the bootstrap's sockets and hands back
connections that deliver frames to a sink (the engine's mailbox). That is all it needs of the rank it
connects, so that is all it gets: the transports stand below the engine, which assembles them.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Wiring:
    loop: asyncio.AbstractEventLoop  # the engine's loop: where the connections' readers run
    rank: int  # this rank, in the world
    comm_id: int  # the world's context (segment and bell names derive from it)
    socks: dict[int, socket.socket]  # peer -> the bootstrap socket to it (set-up messages, then a side channel)
    sink: Any  # where received frames go (the engine's mailbox: ``transport/reader.py``'s Sink)
    liveness: float  # AIOCCL_PEER_TIMEOUT: seconds without a peer's acknowledgement before it is lost
    timeout: float  # the set-up's deadline
