"""Which transport each pair of ranks uses, and how many TCP streams the others open.

``TRANSPORTS`` is the table of transports, tried in order (NCCL's ``ncclTransports[]``): each row says
what this rank tells the others (``hello``), which peers it takes of those no earlier row took
(``choose``: pure, so both sides of a pair agree) and brings their pairs up (``connect``, given a
``Wiring`` record, not the engine). TCP takes every peer left; its stream count per pair is decided
here too, before any data connection exists (the bootstrap dials them), by both sides alike: pairs
that will run over ib or a shared-memory pair keep their one socket (a side channel then); the others
open as many streams as the lower of the two ranks' ``AIOCCL_NSOCKS``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ..bootstrap.mesh import Streams
from .ib import setup as ib_setup
from .shm import pair_setup
from .stripes import streams_setting
from .wiring import Wiring


class Setup(Protocol):
    """One row of the transports' table: the set-up verbs every transport has."""

    name: str

    def hello(self) -> dict[str, Any]: ...

    def choose(self, peers: list[dict[str, Any]], rank: int, taken: set[int]) -> set[int]: ...

    async def connect(self, w: Wiring, peers: set[int]) -> dict[int, Any]: ...


# tried in order; a row's set-up is made once per engine (it reads its settings then)
TRANSPORTS: tuple[Callable[[], Setup], ...] = (ib_setup.IbSetup, pair_setup.PairSetup)


async def connect_all(setups: list[Setup], w: Wiring, peers: list[dict[str, Any]]) -> dict[int, Any]:
    """Every row's pairs, in the table's order: peer -> its connection (the peers left go over TCP)."""
    conns: dict[int, Any] = {}
    for setup in setups:
        chosen = setup.choose(peers, w.rank, set(conns))
        if chosen:
            conns.update(await setup.connect(w, chosen))
    return conns


def hello(env: Mapping[str, str] = os.environ) -> dict[str, int]:
    """What this rank tells the others: the streams it would open to a peer on another host."""
    return {"nsocks": streams_setting(env)}


def tcp_streams(net: str) -> Streams:
    """``streams(table, rank, j)`` for the mesh (how many streams a pair opens); ``net``: ``AIOCCL_NET``'s setting."""
    elsewhere: dict[int, set[int]] = {}  # per rank: its peers on ib or a shared-memory pair (computed once)

    def streams(peers: list[dict[str, Any]], rank: int, j: int) -> int:
        if rank not in elsewhere:
            ib = ib_setup.choose(peers, rank, net)
            elsewhere[rank] = ib | pair_setup.choose(peers, rank, exclude=ib)
        if j in elsewhere[rank]:
            return 1
        return max(1, min(int(peers[rank].get("nsocks", 1)), int(peers[j].get("nsocks", 1))))

    return streams
