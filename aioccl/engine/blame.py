"""Whom a timed-out collective was really waiting for: the wait-for chain, followed through peers' reports.

Why: when a host drops off the network, every survivor's deadline fires at
about the same moment, and each names the rank it waited for directly: in a
ring, its left neighbour, alive and itself waiting. But every rank that gives
an op up tells the others whom it waited for (its FAIL notice), so a rank can
follow the chain (I wait for 0, 0 waits for 5, 5 says nothing) to the ranks
that are silent, and name those. Reports keep arriving for a moment after the
first deadline, so the chain is followed for a short grace
(``min(GRACE_MAX, GRACE_SHARE x the op's timeout)``), less when every rank at
its end is already known lost. Pure but for that wait.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Container

from ..errors import CollectiveTimeout
from ..transport.frames import LOST, TIMEOUT

GRACE_MAX = 1.0
GRACE_SHARE = 0.25
KEPT = 256  # ops whose reports are kept (the newest)


class Reports:
    """Per collective (ctx, seq): world rank -> the world ranks it said it waited for (first word wins)."""

    def __init__(self) -> None:
        self._ops: OrderedDict[tuple[int, int], dict[int, list[int]]] = OrderedDict()

    def record(self, op: tuple[int, int], reporter: int, cause: int, culprits: list[int]) -> None:
        """A FAIL notice's word (kept for timeouts and lost peers: the causes that name whom it waited for)."""
        if cause not in (TIMEOUT, LOST):
            return
        per = self._ops.get(op)
        if per is None:
            per = self._ops[op] = {}
            if len(self._ops) > KEPT:
                self._ops.popitem(last=False)
        per.setdefault(reporter, list(culprits))

    def of(self, op: tuple[int, int]) -> dict[int, list[int]]:
        """Whom each rank waits for as of collective ``op``: its report for that op, else for the latest
        earlier op of the communicator it reported on (a rank stuck in an earlier collective is still
        waiting there: a host cut off mid-op leaves some ranks one op behind the others)."""
        ctx, seq = op
        merged: dict[int, tuple[int, list[int]]] = {}
        for (c, s), per in self._ops.items():
            if c == ctx and s <= seq:
                for reporter, culprits in per.items():
                    if reporter not in merged or merged[reporter][0] < s:
                        merged[reporter] = (s, culprits)
        return {r: culprits for r, (_s, culprits) in merged.items()}


def follow(mine: list[int], reports: dict[int, list[int]], me: int) -> tuple[list[int], list[int]]:
    """(the silent ranks at the chain's end, the ranks it went through), from the ranks ``mine`` an error
    names; a rank that reported is alive and waiting, one that did not is an end. ``reports`` holds this
    rank's (``me``) own wait too: a chain that comes back here goes on through it."""
    ends, via, seen = set(), [], set()
    frontier = list(mine)
    while frontier:
        r = frontier.pop()
        if r in seen:
            continue
        seen.add(r)
        told = reports.get(r)
        if told:
            if r != me:
                via.append(r)
            frontier += told
        else:  # it reported no wait (or never reported): an end. This rank too, when the chain comes back
            ends.add(r)  # to it waiting for nobody: it came late to an op the others gave up waiting for it
    return sorted(ends), sorted(via)


async def settle(mine: list[int], reports: Callable[[], dict[int, list[int]]], me: int, lost: Container[int],
                 grace: float) -> tuple[list[int], list[int]]:
    """``follow`` until the grace is over, or sooner once every rank at the end is known lost."""
    loop = asyncio.get_running_loop()
    end = loop.time() + grace
    while True:
        ends, via = follow(mine, reports(), me)
        if (ends and all(r in lost for r in ends)) or loop.time() >= end:
            return ends, via
        await asyncio.sleep(min(0.01, max(0.0, end - loop.time())))


async def named(err: CollectiveTimeout, ranks: tuple[int, ...], me: int, own: list[int],
                reports: Callable[[], dict[int, list[int]]], lost: Container[int]) -> CollectiveTimeout:
    """``err`` (this rank's timeout, or one a peer told it) naming the silent ranks at the end of its chain
    instead of the ones in between (``ranks``: the communicator's world ranks; ``me``: this world rank;
    ``own``: the communicator ranks this rank itself still waited for)."""
    mine = [ranks[r] for r in err.waiting_for if 0 <= r < len(ranks)]
    if not mine:
        return err
    grace = min(GRACE_MAX, GRACE_SHARE * err.timeout)
    mine_own = [ranks[r] for r in own if 0 <= r < len(ranks)]
    ends, via = await settle(mine, lambda: {**reports(), me: mine_own}, me, lost, grace)
    if not ends or sorted(ends) == sorted(mine):
        return err

    def local(world: list[int]) -> list[int]:
        return [ranks.index(w) for w in world if w in ranks]

    out = CollectiveTimeout(err.op, err.seq, local(ends), err.timeout,
                            f"{err.detail}; ranks {local(via)} wait in turn, for ranks {local(ends)}, which said "
                            "nothing", err.comm)
    out.relayed = err.relayed
    return out
