"""Which peer pairs go over shared memory, and bringing their FIFOs up over the bootstrap sockets.

Choice, per pair, made identically on both sides from the bootstrap's table:
shared memory when the two ranks share a host (equal host identity, which
includes the network namespace) and both can use it (``hello`` says why
not: ``AIOCCL_SHM_DISABLE``, not x86, no ``/dev/shm``), unless the pair goes
over ib (``AIOCCL_NET=ib`` puts every pair there).

Bring-up: each rank makes one segment holding an inbound FIFO for each of its
shared-memory peers, then, per pair, two JSON messages each way on the
pair's socket: (1) my segment's name and where the peer's FIFO lies in it;
(2) whether mapping the peer's segment worked here. The pair uses shared
memory only if both said yes; otherwise it stays on TCP, with a warning.
Afterwards the segment is unlinked: it lives exactly as long as its mappings,
so nothing is left in ``/dev/shm`` even after ``kill -9``.
"""

from __future__ import annotations

import asyncio
import os
import platform
from collections.abc import Mapping
from typing import Any

from ... import log
from ...bootstrap.sockio import recv_json, send_json
from ...envvars import env_int
from ..cma import PeerMemory, cookie
from ..wiring import Wiring
from .fifo import ByteFifo, fifo_bytes
from .pair import PairHub, ShmPairConnection
from .segment import CONTROL_BYTES, SHM_DIR, Segment, segment_name, sweep_stale, wait_policy

_log = log.get("SHM")
DEFAULT_RING = 4 << 20
PAIR_SALT = 0x5041495252494E47  # keeps the FIFO segments' names apart from the collectives' segments
TSO_MACHINES = ("x86_64", "AMD64", "i686", "i386")  # the FIFOs rely on total store order


def ring_capacity(env: Mapping[str, str] = os.environ) -> int:
    """``AIOCCL_SHM_RING``: bytes of each direction's FIFO between two same-host ranks."""
    return env_int(env, "AIOCCL_SHM_RING", DEFAULT_RING, 4096, 1 << 30) // 64 * 64


def hello(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """What this rank tells the others at the root: ``shm_pair`` is empty when it can, else why not."""
    why = ""
    if env.get("AIOCCL_SHM_DISABLE", "0").strip().lower() not in ("", "0", "false", "no"):
        why = "AIOCCL_SHM_DISABLE is set"
    elif platform.machine() not in TSO_MACHINES:
        why = f"shared memory is only enabled on x86 (this is {platform.machine()})"
    elif not os.path.isdir(SHM_DIR):
        why = f"{SHM_DIR} does not exist"
    return {"shm_pair": why}


def choose(peers: list[dict[str, Any]], rank: int, exclude: set[int]) -> set[int]:
    """The peers to reach over shared memory (pure; both sides of a pair compute the same answer)."""
    me = peers[rank]
    if me.get("shm_pair", "-"):
        return set()
    return {j for j, p in enumerate(peers)
            if j != rank and j not in exclude and p.get("host") == me.get("host") and p.get("shm_pair", "-") == ""}


async def connect(w: Wiring, peers: set[int],
                  env: Mapping[str, str] = os.environ) -> tuple[PairHub | None, dict[int, ShmPairConnection]]:
    """Bring up a FIFO pair to each of ``peers``; returns the bell and the pairs that made it."""
    if not peers:
        return None, {}
    comm_id, liveness, timeout = w.comm_id, w.liveness, w.timeout
    cap = ring_capacity(env)
    order = sorted(peers)
    slot = {j: i for i, j in enumerate(order)}  # where each peer's inbound FIFO lies in my segment
    half = -(-len(order) * fifo_bytes(cap) // 2 // 64) * 64
    mine: Segment | None = None
    hub: PairHub | None = None
    why_not = ""
    try:
        sweep_stale()
        mine = Segment.create(segment_name(comm_id ^ PAIR_SALT, w.rank, os.getpid()), half, 0)
        hub = PairHub(w.loop, comm_id, w.rank)
        hub.segment = mine
        hub.spin_s, hub.yield_cpu = wait_policy(env, 1 + len(order))
    except OSError as e:
        why_not = f"could not set up my FIFOs: {e}"
    conns: dict[int, ShmPairConnection] = {}

    async def pair(j: int) -> None:
        sock = w.socks[j]
        err = why_not
        offer: dict[str, Any] = ({"seg": mine.name, "off": CONTROL_BYTES + slot[j] * fifo_bytes(cap), "cap": cap,
                                  "cma": cookie()} if mine is not None and hub is not None else {"fail": why_not})
        await send_json(sock, offer)
        theirs = await recv_json(sock)
        tx: ByteFifo | None = None
        theirs_seg: Segment | None = None
        if "fail" in theirs:
            err = f"rank {j}: {theirs['fail']}"
        elif mine is not None:
            try:
                theirs_seg = Segment.open(str(theirs["seg"]))
                tx = ByteFifo(memoryview(theirs_seg.mm), int(theirs["off"]), int(theirs["cap"]))
            except (OSError, ValueError, KeyError) as e:
                err = f"could not map rank {j}'s FIFOs: {e}"
        await send_json(sock, {"ok": tx is not None, "why": err})
        answer = await recv_json(sock)
        if tx is not None and answer.get("ok"):
            assert mine is not None and hub is not None
            rx = ByteFifo(memoryview(mine.mm), offer["off"], cap)
            conn = conns[j] = ShmPairConnection(hub, j, w.sink, sock, tx, rx, liveness, segment=theirs_seg)
            conn.memory = PeerMemory.open(theirs.get("cma"))
            return
        if tx is not None:
            tx.release()
            err = f"rank {j}: {answer.get('why')}"
        if theirs_seg is not None:
            theirs_seg.close()
        _log.warning("shared memory to rank %d failed, using TCP for this pair: %s", j, err)

    try:
        async with asyncio.timeout(timeout):
            await asyncio.gather(*(pair(j) for j in order))
    except BaseException:
        for c in conns.values():
            c._shut()
        if hub is not None:
            hub.close()
        elif mine is not None:
            mine.close()
        raise
    finally:
        if mine is not None:
            mine.unlink()  # every peer that will map it has: it now lives as long as its mappings
    if not conns:
        if hub is not None:
            hub.close()
            hub = None
        elif mine is not None:
            mine.close()
    if conns:
        _log.info("rank %d: shared memory to %d peer(s), %d KiB FIFOs each way", w.rank, len(conns), cap >> 10)
    return hub, conns


class PairSetup:
    """Shared-memory pairs as a row of the transports' table (``pairing.py``); keeps the bell it made."""

    name = "shm pair"

    def __init__(self, env: Mapping[str, str] = os.environ) -> None:
        self.env = env
        self.hub: PairHub | None = None

    def hello(self) -> dict[str, Any]:
        return hello(self.env)

    def choose(self, peers: list[dict[str, Any]], rank: int, taken: set[int]) -> set[int]:
        return choose(peers, rank, exclude=taken)

    async def connect(self, w: Wiring, peers: set[int]) -> dict[int, Any]:
        self.hub, conns = await connect(w, peers, self.env)
        return dict(conns)
