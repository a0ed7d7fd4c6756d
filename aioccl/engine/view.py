"""What the engine knows of a communicator: its context id and its rank map onto the world.

A child communicator (``split``, ``shrink``) is only this over its parent's
connections: the engine, the pairs and the mailbox are the process's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CommView:
    """What the engine needs to know of a communicator."""

    ctx: int
    rank: int
    size: int
    ranks: tuple[int, ...]  # communicator rank -> world rank
