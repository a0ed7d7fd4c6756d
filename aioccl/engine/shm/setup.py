"""Bring up the shared-memory channel, or agree that there is none.

Every rank of a communicator whose ranks all share one host takes part,
even one that cannot or will not use shared memory, because the decision
must be unanimous: two tiny all-reduces over the sockets ("did you create
your segment?", "did you map everyone's, and can you read every peer's
memory in place?") make it so. After the second the segments are unlinked;
any failure means sockets for everyone, and a log line says why. Reading in
place (``transport/cma.py``) is unanimous too: a rank lets its peers read
its buffers where they lie only if every rank can read every other.

Settings (read here, per rank): ``AIOCCL_SHM_DISABLE=1``, the staging size
``AIOCCL_SHM_BUFFSIZE`` (bytes per slot half; the smallest over the ranks
wins), the registered heap ``AIOCCL_SHM_HEAP`` (bytes), the spin before
sleeping ``AIOCCL_SHM_SPIN_US``, reading in place ``AIOCCL_SHM_CMA`` and from
how many bytes ``AIOCCL_SHM_CMA_MIN_BYTES``.
"""

from __future__ import annotations

import asyncio
import os
import platform
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import log
from ...algorithms import plan
from ...algorithms.table import BY_NAME
from ...dtypes import ReduceOp, dtype_code
from ...envvars import env_int
from ...errors import CollectiveTimeout
from ...transport.cma import PeerMemory
from ...transport.shm.segment import (
    NONCE,
    PID,
    SELF,
    SHM_DIR,
    LoopBell,
    Segment,
    segment_name,
    sweep_stale,
    wait_policy,
)
from ...work import Work
from ..executor import drive, execute
from ..op import Op, Progress
from ..view import CommView
from .channel import ShmChannel

if TYPE_CHECKING:
    from ..services import EngineServices

_log = log.get("SHM")
DEFAULT_HALF = 1 << 20
DEFAULT_HEAP = 256 << 20
# a buffer from this size on is read in place by its peers rather than staged (one copy, not two; below it the
# system call, which pins the pages it reads, and the closing step that waits for everyone cost more than the
# copy saves: docs/benchmarks.md, "Reading in place")
DEFAULT_CMA_MIN = 256 << 10
SETUP_CTX_SALT = 0x53484D5345545550  # keeps the setup messages apart from any communicator's
# shared-memory ordering relies on total store order; other architectures keep to sockets for now
TSO_MACHINES = ("x86_64", "AMD64", "i686", "i386")


def settings(env: Mapping[str, str]) -> dict[str, Any]:
    return {
        "disabled": env.get("AIOCCL_SHM_DISABLE", "0").strip().lower() not in ("", "0", "false", "no"),
        "half": env_int(env, "AIOCCL_SHM_BUFFSIZE", DEFAULT_HALF, 4096) // 64 * 64,
        "heap": env_int(env, "AIOCCL_SHM_HEAP", DEFAULT_HEAP, 0) // 4096 * 4096,
        "cma_min": env_int(env, "AIOCCL_SHM_CMA_MIN_BYTES", DEFAULT_CMA_MIN, 1),
    }


def readers(segs: list[Segment], rank: int) -> list[PeerMemory | None] | None:
    """A reader of each peer's memory (None for me), or None unless every peer's can be read in place: its
    segment names its pid, where it maps the segment and a random word there, which must read back."""
    out: list[PeerMemory | None] = []
    for j, seg in enumerate(segs):
        if j == rank:
            out.append(None)
            continue
        ctl = memoryview(seg.mm)[:64].cast("q")
        pid, addr, value = ctl[PID], ctl[SELF] + NONCE * 8, ctl[NONCE]
        ctl.release()
        mem = PeerMemory.proven(pid, addr, value)
        if mem is None:
            return None
        out.append(mem)
    return out


async def _agree(engine: EngineServices, view: CommView, step: int, ok: int, progress: Progress) -> int:
    """The least of every rank's ``ok`` (a MIN all-reduce over the pairs): nonzero when every rank says ok."""
    n, rank = view.size, view.rank
    setup_view = CommView(view.ctx ^ SETUP_CTX_SALT, rank, n, view.ranks)
    flag = np.array([int(ok)], dtype=np.int32)
    sched = plan("all_reduce", 1, rank, n, 0, 1024, "rd")
    scratch = np.zeros(sched.scratch, dtype=np.int32)
    op = Op(f"shared-memory setup step {step}", BY_NAME["all_reduce"].code, step, flag, flag,
            dtype_code(flag.dtype), ReduceOp.MIN, 1, 0, 0.0, Work("setup", step), lambda: None, sched)
    op.progress = progress
    await drive(execute(engine, setup_view, op, scratch))
    return int(flag[0])


async def setup(engine: EngineServices, view: CommView, timeout: float, what: str = "create",
                env: Mapping[str, str] = os.environ) -> ShmChannel | None:
    """The channel of communicator ``view`` (the world, or a child), or None when its ranks keep to the
    pairs' socket schedules; every rank of ``view`` calls it at the same point."""
    n, rank = view.size, view.rank
    assert engine.table is not None
    peers = [engine.table.peers[w] for w in view.ranks]
    if n == 1 or len({p["host"] for p in peers}) != 1:
        return None  # a multi-host communicator: the same on every rank, no agreement needed
    conf = settings(env)
    why = ""
    if conf["disabled"]:
        why = "AIOCCL_SHM_DISABLE is set"
    elif platform.machine() not in TSO_MACHINES:
        why = f"shared memory is only enabled on x86 (this is {platform.machine()})"
    elif not os.path.isdir(SHM_DIR):
        why = f"{SHM_DIR} does not exist"
    mine: Segment | None = None
    bell: LoopBell | None = None
    segs: list[Segment | None] = [None] * n
    if not why:
        try:
            sweep_stale()
            mine = Segment.create(segment_name(view.ctx, rank, os.getpid()), conf["half"], conf["heap"],
                                  keep_fd=rank == 0)
            bell = engine.channel_bell()
        except OSError as e:
            why = f"could not create the segment: {e}"
    progress = Progress()
    cma: list[PeerMemory | None] | None = None
    try:
        async with asyncio.timeout(timeout):
            if not await _agree(engine, view, 0, not why, progress):
                raise _NoShm(why or "another rank could not set up shared memory")
            segs[rank] = mine
            try:
                for j in range(n):
                    if j != rank:
                        segs[j] = Segment.open(segment_name(view.ctx, j, int(peers[j]["pid"])), keep_fd=j == 0)
            except OSError as e:
                why = f"could not map a peer's segment: {e}"
            if not why:
                cma = readers([s for s in segs if s is not None], rank)
            agreed = await _agree(engine, view, 1, 0 if why else 2 if cma is not None else 1, progress)
            if not agreed:
                raise _NoShm(why or "another rank could not map every segment")
            if agreed < 2:
                cma = None  # some rank cannot read some peer in place: nobody offers its buffers
    except BaseException as e:
        for seg in (*segs, mine):
            if seg is not None:
                seg.close()  # also unlinks my file
        if isinstance(e, TimeoutError) and not isinstance(e, CollectiveTimeout):
            raise CollectiveTimeout(what, -1, progress.waiting_for(), timeout,
                                    "setting up the shared-memory channel", f"{view.ctx:x}") from None
        if not isinstance(e, _NoShm):
            raise
        (_log.info if conf["disabled"] else _log.warning)("rank %d: using sockets, not shared memory: %s", rank, e)
        return None
    assert mine is not None and bell is not None
    mine.unlink()  # everyone has mapped it: from now on it lives exactly as long as its mappings
    local = sum(1 for p in engine.table.peers if p["host"] == peers[rank]["host"])
    spin_s, yield_cpu = wait_policy(env, local)
    chan = ShmChannel(engine.loop, rank, [s for s in segs if s is not None], bell, engine.pool,
                      spin_s, yield_cpu=yield_cpu, ctx=view.ctx, world=view.ranks, readers=cma,
                      cma_min=conf["cma_min"])
    engine.attach_channel(chan, view)
    _log.info("rank %d: shared memory with %d local ranks (comm %x), %d KiB staging halves, %d MiB heap, %s", rank,
              n, view.ctx, chan.cap_bytes >> 10, conf["heap"] >> 20,
              f"buffers from {conf['cma_min']} bytes read in place" if cma is not None else "no reading in place")
    return chan


class _NoShm(Exception):
    pass
