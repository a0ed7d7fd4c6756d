"""What the GPU path takes from the communicator that owns it, and nothing more.

The GPU path sits below the public API: it never holds the ``Communicator`` it serves (which would put
the GPU layer above the API and close an import circle through it). The communicator hands down this
record at its first GPU op instead: who this rank is, the engine that runs the path's host side, the
private group of the same ranks for host-side messages (the set-up, the staged path, point-to-point),
the flight recorder, and where to publish the native lane for its collectives to call first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..work import Work


@dataclass(frozen=True)
class Owner:
    rank: int
    world_size: int
    local_world_size: int
    comm_id: str  # the communicator's context, as errors name it (hex)
    engine: Any  # launch, spawn, placement
    side: Work[Any]  # the private group (a split of the owner, issued by every rank at the same point)
    record: Callable[[tuple[Any, ...]], None]  # into the flight recorder: (op, seq, desc, exc, took)
    publish_lane: Callable[[Any], None]  # the owner's collectives call this lane first (None: none)
