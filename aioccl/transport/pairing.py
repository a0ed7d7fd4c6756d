"""How many TCP streams each pair of ranks opens, from the rendezvous table alone.

Decided before any data connection exists (the bootstrap dials them), and
by both sides of a pair alike: pairs that will run over ib or a
shared-memory pair keep their one socket (a side channel then); the others
open as many streams as the lower of the two ranks' ``AIOCCL_NSOCKS``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..bootstrap.rendezvous import Streams
from . import shm_pair_setup as pair_setup
from .ib import setup as ib_setup
from .lanes import streams_setting


def hello(env: Mapping[str, str] = os.environ) -> dict[str, int]:
    """What this rank tells the others: the streams it would open to a peer on another host."""
    return {"nsocks": streams_setting(env)}


def tcp_streams(net: str) -> Streams:
    """``streams(table, rank, j)`` for the rendezvous; ``net`` is ``AIOCCL_NET``'s setting."""
    elsewhere: dict[int, set[int]] = {}  # per rank: its peers on ib or a shared-memory pair (computed once)

    def streams(peers: list[dict[str, Any]], rank: int, j: int) -> int:
        if rank not in elsewhere:
            ib = ib_setup.choose(peers, rank, net)
            elsewhere[rank] = ib | pair_setup.choose(peers, rank, exclude=ib)
        if j in elsewhere[rank]:
            return 1
        return max(1, min(int(peers[rank].get("nsocks", 1)), int(peers[j].get("nsocks", 1))))

    return streams
