"""The mismatch promise under every frame ordering that could matter: a rank never returns data from another call.

Ranks ``0 .. n-2`` issue one call, rank ``n-1`` (the odd rank) another. Which rank learns of the mismatch
first, and whether a partial result is already on its way when it does, depends on the order in which frames
and notices arrive. This test forces those orders instead of waiting for the suite's load to find them: one
link touching the odd rank is slowed (``SlowLink``: every frame on it, in order, held back ``D``), with or
without every failure notice held back ``2 D``, on each transport, at 2-5 ranks, for every algorithm the
tuner can run at these sizes (forced one by one).

The rule checked, on every rank: it raises ``CollectiveMismatch`` naming the op's seq and the odd rank, or
its result holds no data from the odd rank's call (which carries a marker no other rank's data reaches) and
is what its own call makes of checked data only (a send-only role, a broadcast from the agreed root). Then
the communicator is still usable: the next collective is exact everywhere.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import aioccl
from aioccl.algorithms import ALGORITHMS
from aioccl.algorithms.shm import SHM_ALGORITHMS
from aioccl.transport.frames import FAIL, HEADER_SIZE, MISMATCH, PROBE, unpack
from aioccl.tuning import Tuning

from conftest import make_comms

D = 0.004  # the unit frames are held back by: far above one in-process hop, far below any deadline
MARK = 1000  # the odd rank's data; every other rank's values stay below it, in any sum of up to 5 ranks
NOTICES = (MISMATCH, FAIL, PROBE)

# name -> (collective of ranks 0..n-2, collective of the odd rank, rooted: may a send-only role succeed)
Call = Callable[[aioccl.Communicator, np.ndarray, int], aioccl.Work[Any]]
CASES: dict[str, tuple[str, Call, str, Call, bool]] = {
    "count": ("all_reduce", lambda c, x, n: c.all_reduce(x[:4]),
              "all_reduce", lambda c, x, n: c.all_reduce(x[:5]), False),
    "dtype": ("all_reduce", lambda c, x, n: c.all_reduce(x[:4]),
              "all_reduce", lambda c, x, n: c.all_reduce(x[:4].view(np.int32)), False),
    "reduction": ("all_reduce", lambda c, x, n: c.all_reduce(x[:4], op="sum"),
                  "all_reduce", lambda c, x, n: c.all_reduce(x[:4], op="max"), False),
    "kind": ("all_reduce", lambda c, x, n: c.all_reduce(x[:6]),
             "broadcast", lambda c, x, n: c.broadcast(x[:6]), False),
    "root": ("broadcast", lambda c, x, n: c.broadcast(x[:4], root=0),
             "broadcast", lambda c, x, n: c.broadcast(x[:4], root=n - 1), True),
    "reduce root": ("reduce", lambda c, x, n: c.reduce(x[:4], root=1),
                    "reduce", lambda c, x, n: c.reduce(x[:4], root=0), True),
}


class SlowLink:
    """One direction of one pair, slowed: each frame waits ``hold(kind)`` seconds behind the frames sent before
    it, so the link stays in order as every transport's is; but a failure notice waits in a lane of its own, so
    it can arrive after data sent later, as on the ib transport (whose notices go out from a task of their own)."""

    def __init__(self, conn: Any, hold: Callable[[int], float]) -> None:
        self.conn, self.hold = conn, hold
        self.send0, self.control0 = conn.send, getattr(conn, "send_control", None)
        self.queues: tuple[deque[Any], deque[Any]] = (deque(), deque())  # data and control; notices
        self.pumps: list[asyncio.Task[None] | None] = [None, None]
        conn.send = self.send
        if self.control0 is not None:
            conn.send_control = self.control

    def undo(self) -> None:
        del self.conn.send
        if self.control0 is not None:
            del self.conn.send_control

    def _put(self, header: bytes, payload: Any, fut: asyncio.Future[None] | None) -> None:
        loop = asyncio.get_running_loop()
        kind = unpack(header[:HEADER_SIZE]).kind
        lane = int(kind in NOTICES)
        self.queues[lane].append((loop.time() + self.hold(kind), header, payload, fut))
        pump = self.pumps[lane]
        if pump is None or pump.done():
            self.pumps[lane] = loop.create_task(self._drain(self.queues[lane]))

    async def send(self, header: bytes, payload: Any) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._put(header, payload, fut)
        await fut

    def control(self, frame: bytes) -> None:
        self._put(frame, None, None)

    async def _drain(self, queue: deque[Any]) -> None:
        loop = asyncio.get_running_loop()
        while queue:
            due, header, payload, fut = queue[0]
            if due > loop.time():
                await asyncio.sleep(due - loop.time())
            queue.popleft()
            try:
                if fut is None:
                    assert self.control0 is not None
                    self.control0(header)
                else:
                    await self.send0(header, payload)
                    fut.set_result(None)
            except BaseException as e:  # the peer is gone: the sender learns it as from the transport
                if fut is not None and not fut.done():
                    fut.set_exception(e)


Pattern = tuple[float, float, tuple[int, int] | None, bool]


def patterns(n: int) -> list[Pattern]:
    """(the odd rank's frames held back, frames to it held back, one more link slowed by ``D`` or None, are the
    notices held back ``4 D``) for every order that could matter: the odd rank's frame before or after the
    others' at each receiver, its receiver still sending or not when it lands, a partial result on its way
    while the notice lags or not, and each link from or to the odd rank alone."""
    odd = n - 1
    links = [(odd, j) for j in range(odd)] + [(j, odd) for j in range(odd)]
    every = [(out, into, None, late) for out in (0.0, D) for into in (0.0, 2 * D) for late in (False, True)]
    return every + [(0.0, 0.0, link, late) for link in links for late in (False, True)]


def algorithms(transport: str, colls: set[str]) -> list[dict[str, str]]:
    """Every algorithm the tuner may run these collectives with here, one forced set at a time (on shared
    memory its lockstep ones, and the message ones over the pairs)."""
    sets = [{c: ALGORITHMS[c] for c in colls}] + ([{c: SHM_ALGORITHMS[c] for c in colls}] if transport == "shm" else [])
    return [{c: v[i % len(v)] for c, v in per.items()} for per in sets for i in range(max(map(len, per.values())))]


def force(comms: list[aioccl.Communicator], algos: dict[str, str]) -> None:
    for c in comms:
        c._planner.tuning = Tuning(forced=tuple(algos.items()))
        c._planner.forget()


def slow(comms: list[aioccl.Communicator], pattern: Pattern) -> list[SlowLink]:
    """Hold frames back as ``pattern`` says (``patterns``)."""
    out, into, link, late = pattern
    odd, made = len(comms) - 1, []
    for src, c in enumerate(comms):
        for dst, conn in c._engine.conns.items():
            base = out if src == odd else into if dst == odd else 0.0
            base += D if link == (src, dst) else 0.0
            if dst != src and (base or late):
                made.append(SlowLink(conn, lambda kind, base=base: 4 * D if late and kind in NOTICES else base))
    return made


def expected_ok(case: str, rank: int, n: int, before: np.ndarray, after: np.ndarray) -> bool:
    """A rank that returned: its result holds nothing of the odd rank's call, and only what its own call
    makes of data whose fingerprints were checked (a rooted op's send-only part, or the agreed root's data)."""
    if (after >= MARK).any() and rank != n - 1:
        return False
    if case == "root":  # the root's own buffer, or rank 0's data (the root the other ranks agree on)
        return bool((after == before).all() if rank in (0, n - 1) else (after[:4] == 1).all())
    if case == "reduce root":  # a part that only sends: its input, unchanged
        return bool((after == before).all())
    return False  # every other case needs every rank's data: no rank may return


async def one_run(comms: list[aioccl.Communicator], case: str, pattern: Pattern, seq: int, where: str,
                  caplog: pytest.LogCaptureFixture) -> None:
    """The odd rank issues the case's other call, with frames held back as ``pattern`` says; then check."""
    n, (_, same, _, other, rooted) = len(comms), CASES[case]
    odd = n - 1
    caplog.clear()
    xs = [np.full(8, MARK if r == odd else r + 1, np.float32) for r in range(n)]
    before = [x.copy() for x in xs]
    links = slow(comms, pattern)
    try:
        calls = [(other if c.rank == odd else same)(c, x, n) for c, x in zip(comms, xs, strict=True)]
        r = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 10)
    finally:
        for s in links:
            s.undo()
    for rank, (res, x) in enumerate(zip(r, xs, strict=True)):
        if isinstance(res, BaseException):
            assert isinstance(res, aioccl.CollectiveMismatch), (where, rank, res)
            assert res.seq == seq and odd in res.ranks and len(res.calls) == 2, (where, rank, res)
        else:
            assert rooted and expected_ok(case, rank, n, before[rank], x), (where, f"rank {rank} returned {x}", r)
    if not any(isinstance(e, BaseException) for e in r):
        # every part was send-only: the rank that got another call's frame after its part ended says so,
        # and tells the others (no rank waits out its deadline)
        for _ in range(100):
            if any("collective mismatch" in rec.getMessage() for rec in caplog.records):
                break
            await asyncio.sleep(0.01)
        assert any("collective mismatch" in rec.getMessage() for rec in caplog.records), (where, r)
    # the sequence number was consumed everywhere: the next collective matches and is exact
    ys = [np.full(7, c.rank + 1, np.int64) for c in comms]
    await asyncio.wait_for(asyncio.gather(*(c.all_reduce(y) for c, y in zip(comms, ys, strict=True))), 10)
    assert all((y == n * (n + 1) // 2).all() for y in ys), (where, ys)


@pytest.mark.parametrize("n", [2, 3, 4, 5])
@pytest.mark.parametrize("transport", ["tcp", "shm", "ib"])
async def test_no_rank_returns_data_of_a_mismatched_call(transport, n, caplog):
    comms = await make_comms(n, transport=transport, timeout=30)
    runs = 0
    try:
        for case, (coll, _, odd_coll, _, _) in CASES.items():
            for algos in algorithms(transport, {coll, odd_coll}):
                lockstep = transport == "shm" and all(a in SHM_ALGORITHMS[c] for c, a in algos.items())
                force(comms, algos)
                for pattern in patterns(n) if not lockstep else patterns(n)[:2]:  # lockstep: no frames to hold
                    await one_run(comms, case, pattern, 2 * runs, f"{case} {algos} {pattern}", caplog)
                    runs += 1
    finally:
        for c in comms:
            c.abort()
    messages = sum(len(algorithms("tcp", {c[0], c[2]})) for c in CASES.values()) * len(patterns(n))
    assert runs == messages or transport == "shm" and runs > messages
