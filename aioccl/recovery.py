"""After a rank is lost: every communicator with it learns at once, and the survivors agree on who is
alive, for ``Communicator.shrink()``.

*Learning* (``on_member_lost``): every rank holds a connection to every other, so each finds out a
crash by itself (at once, or within ``AIOCCL_PEER_TIMEOUT`` for a dead host), whatever its own
traffic. A communicator that holds the lost rank then fails its in-flight ops that no peer has seen
(an unmatched receive, a queued send, a probe: ops on live peers too, or a rank that only exchanges
messages with live neighbours would wait on them and never shrink) and every later op at once, each
with the same ``PeerLost``; its collectives fail already where they wait. A rank that *closed* its
communicator finished its part of every op first: that is no loss to react to.

Each survivor knows only whom *it* has lost. Agreement runs in rounds over
point-to-point messages on tags beyond the user's range: every rank sends
the set of ranks it believes dead to every rank it believes alive and
receives theirs; a peer that fails to answer (connection lost, or silent
until the deadline) joins the dead set. A round in which every answer equals
this rank's own set ends it; otherwise the union is the next round's set.
Each round has the whole ``timeout``: a silent peer (a cut link) uses up the
first round's, and the survivors, who all waited for it the same time, then
agree in the next round instead of finding each other out of time.
Sets only grow and there are at most ``n`` ranks, so there are at most
``n + 1`` rounds. If every survivor started the same round with the same set,
they all stop in that round with it (this is not a consensus protocol
against ranks that die *during* agreement at unlucky moments; such a rank
shows up as ``PeerLost`` in the next op, and shrinking again is the remedy).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .dtypes import dtype_code
from .errors import AiocclError, PeerLost
from .transport.frames import P2P, Header
from .work import Work

if TYPE_CHECKING:
    from .engine.engine import Engine
    from .engine.view import CommView
    from .state import CommState

SHRINK_TAG = 1 << 62  # user tags are below 2**62; round r uses SHRINK_TAG + r
_U8 = dtype_code(np.dtype(np.uint8))


def on_member_lost(engine: Engine, world_rank: int, lost: PeerLost) -> None:
    """The engine lost ``world_rank`` (engine thread): each of its communicators holding that rank fails
    what is waiting and refuses new ops with ``PeerLost``, until the app shrinks it (through its state,
    ``CommState.lose_member``: the watchdog holds every communicator's state)."""
    if world_rank in engine.mailbox.closed_peers:
        return
    for state in cast("list[CommState]", list(engine.watchdog.comms)):
        ranks = state.view.ranks
        if world_rank in ranks:
            state.lose_member(PeerLost(world_rank, f"{lost.detail}; it was rank {ranks.index(world_rank)} of "
                                                   f"communicator {state.view.ctx:x}, so its ops fail until "
                                                   "comm.shrink()"))


async def agree_on_survivors(engine: Engine, view: CommView, timeout: float) -> list[int]:
    """The communicator ranks that all survivors agree are alive (this rank included), sorted."""
    n, me = view.size, view.rank
    dead = {r for r in range(n) if view.ranks[r] in engine.mailbox.lost}
    loop = asyncio.get_running_loop()
    for rnd in range(n + 1):
        deadline = loop.time() + timeout
        others = [r for r in range(n) if r != me and r not in dead]
        mine = np.zeros(n, dtype=np.uint8)
        mine[list(dead)] = 1
        answers = await _exchange(engine, view, SHRINK_TAG + rnd, mine, others, deadline)
        union = set(dead)
        agreed = True
        for r in others:
            got = answers.get(r)
            if got is None:
                union.add(r)
                agreed = False
                continue
            theirs = {int(i) for i in np.flatnonzero(got)}
            agreed = agreed and theirs == dead
            union |= theirs
        union.discard(me)
        if agreed and union == dead:
            return [r for r in range(n) if r not in dead]
        dead = union
    raise AiocclError(f"shrink: no agreement on the survivors after {n + 1} rounds (dead: {sorted(dead)})")


async def _exchange(engine: Engine, view: CommView, tag: int, mine: np.ndarray, others: list[int],
                    deadline: float) -> dict[int, np.ndarray]:
    """Send ``mine`` to ``others`` and receive theirs; a peer that fails or stays silent is left out."""
    loop = asyncio.get_running_loop()
    payload = mine.data.cast("B")
    hdr = Header(P2P, 0, _U8, 0, view.ctx, tag, len(payload)).pack()
    bufs = {r: np.zeros_like(mine) for r in others}
    futs = {}
    for r in others:
        w: Work[Any] = Work(f"shrink recv(peer={r})", tag)
        fut = engine.mailbox.post_p2p(view.ranks[r], view.ctx, tag, bufs[r].data.cast("B"), _U8,
                                      f"shrink round {tag - SHRINK_TAG} recv from rank {r}", w)
        if fut is not None:
            futs[r] = fut

    async def send(r: int) -> None:
        try:
            await asyncio.wait_for(engine.send(view.ranks[r], hdr, payload), max(0.0, deadline - loop.time()))
        except (AiocclError, TimeoutError):
            pass  # its receive fails too, or times out: it is then counted as dead

    await asyncio.gather(*(send(r) for r in others))
    got: dict[int, np.ndarray] = {}
    for r, fut in futs.items():
        try:
            await asyncio.wait_for(asyncio.shield(fut), max(0.0, deadline - loop.time()))
            got[r] = bufs[r]
        except (AiocclError, TimeoutError):
            engine.mailbox.withdraw(view.ranks[r], view.ctx, tag, fut)
    return got
