"""Run one rank's schedule over the engine's connections.

This is the only place where schedules meet sockets. It follows the round
contract of ``aioccl.algorithms.schedule`` exactly, numbers messages per
peer pair, and keeps track of whom it is waiting for, so a deadline that
passes names the silent ranks.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..algorithms.schedule import Recv, RecvReduce, Region, Schedule
from ..buffers import byte_view
from ..dtypes import ReduceOp
from ..kernels import combine, scale
from ..transport.frames import COLL, Header

if TYPE_CHECKING:
    from .engine import Engine
    from .view import CommView


@dataclass
class Progress:
    """What an op is blocked on right now (read when its deadline passes)."""

    recvs: list[tuple[int, asyncio.Future[None]]] = field(default_factory=list)
    sends: set[int] = field(default_factory=set)

    def waiting_for(self) -> list[int]:
        return sorted({p for p, f in self.recvs if not f.done() or f.cancelled()} | self.sends)


async def execute(engine: Engine, comm: CommView, seq: int, fp: tuple[int, int, int, int, int], what: str,
                  sched: Schedule, bufs: tuple[np.ndarray, np.ndarray, np.ndarray], op: ReduceOp | None,
                  progress: Progress) -> None:
    """``bufs`` = typed flat (IN, OUT, SCRATCH); IN may be OUT. ``fp`` is the op's fingerprint
    (code, dtype, reduction, count, root), carried by every frame."""
    code, dtype_code, redop, count, root = fp
    bytes_ = tuple(byte_view(b) for b in bufs)
    item = bufs[1].itemsize
    mailbox, ranks = engine.mailbox, comm.ranks

    def typed(r: Region) -> np.ndarray:
        return bufs[r.buf][r.start:r.stop]

    def raw(r: Region) -> memoryview:
        return bytes_[r.buf][r.start * item:r.stop * item]

    sent_k: dict[int, int] = {}
    recv_k: dict[int, int] = {}
    for rnd in sched.rounds:
        for c in rnd.copies:
            src, dst = typed(c.src), typed(c.dst)
            if not (src.size and src.__array_interface__["data"][0] == dst.__array_interface__["data"][0]):
                dst[...] = src
        progress.recvs.clear()
        for t in rnd.recvs:
            k = recv_k.get(t.peer, 0)
            recv_k[t.peer] = k + 1
            target = raw(t.dst if isinstance(t, Recv) else t.tmp)
            fut = mailbox.post(ranks[t.peer], comm.ctx, seq, k, target, code, dtype_code, what)
            progress.recvs.append((t.peer, fut))
        if rnd.sends:
            sends = []
            for s in rnd.sends:
                k = sent_k.get(s.peer, 0)
                sent_k[s.peer] = k + 1
                payload = raw(s.src)
                hdr = Header(COLL, code, dtype_code, k, comm.ctx, seq, len(payload), count, root, redop).pack()
                sends.append(_send(engine, comm, s.peer, hdr, payload, progress))
            if len(sends) == 1:
                await sends[0]
            else:
                await asyncio.gather(*sends)
        for _peer, fut in progress.recvs:
            await fut
        for t in rnd.recvs:
            if isinstance(t, RecvReduce) and op is not None:
                combine(op, typed(t.dst), typed(t.src), typed(t.tmp))
    if op is ReduceOp.AVG:
        for reg in sched.scale:
            scale(op, typed(reg), comm.size)


async def _send(engine: Engine, comm: CommView, peer: int, hdr: bytes, payload: memoryview,
                progress: Progress) -> None:
    progress.sends.add(peer)
    await engine.send(comm.ranks[peer], hdr, payload)
    progress.sends.discard(peer)
