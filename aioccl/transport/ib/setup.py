"""Which peer pairs go over ib, and bringing their queue pairs up over the bootstrap sockets.

Choice, per pair, made identically on both sides from the bootstrap's table
(every rank's hello says which ib backend it can use, or why none):

- ``AIOCCL_NET=socket``: never ib;
- ``AIOCCL_NET=auto`` (default): ib when both ranks have a usable port on the
  same backend and they are on different hosts (same-host pairs use shared
  memory or loopback TCP);
- ``AIOCCL_NET=ib``: every pair, same host included (shared memory, where
  it is on, still carries the collectives of a one-host world); an unusable
  side is an error that names the rank and its reason.

Bring-up of one pair, two JSON messages each way on the pair's socket:
(1) my queue pair's endpoint, my FIFO's address and key, my slot settings;
(2) whether connecting (INIT -> RTR -> RTS) worked here. The pair uses ib only
if both said yes; otherwise it falls back to TCP with a warning (an error
under ``AIOCCL_NET=ib``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ... import log
from ...bootstrap.sockio import recv_json, send_json
from ...envvars import env_int
from ...errors import BootstrapError, InvalidArgument
from ..wiring import Wiring
from .connection import IbConnection
from .detect import Verdict, detect
from .port import Port
from .protocol import recv_depth, send_depth
from .verbs import Device, Endpoint

_log = log.get("NET")
DEFAULT_SLOT = 512 << 10
DEFAULT_SLOTS = 8


@dataclass(frozen=True)
class Settings:
    net: str  # auto | ib | socket
    slot: int
    nslots: int
    timeout: int
    retry_cnt: int
    sl: int
    tc: int


def settings(env: Mapping[str, str] = os.environ) -> Settings:
    net = (env.get("AIOCCL_NET", "") or "auto").strip().lower()
    if net not in ("auto", "ib", "socket"):
        raise InvalidArgument(f"AIOCCL_NET={net!r} is not one of auto, ib, socket")
    return Settings(net,
                    env_int(env, "AIOCCL_IB_BUFFSIZE", DEFAULT_SLOT, 4096, 16 << 20) // 64 * 64,
                    env_int(env, "AIOCCL_IB_SLOTS", DEFAULT_SLOTS, 2, 1024),
                    env_int(env, "AIOCCL_IB_TIMEOUT", 20, 1, 31),
                    env_int(env, "AIOCCL_IB_RETRY_CNT", 7, 0, 7),
                    env_int(env, "AIOCCL_IB_SL", 0, 0, 15),
                    env_int(env, "AIOCCL_IB_TC", 0, 0, 255))


def hello(v: Verdict) -> dict[str, str]:
    """What this rank tells the others at the root: its ib backend, or why it has none."""
    return {"ib": v.backend if v.usable else "", "ib_reason": v.reason}


def choose(peers: list[dict[str, Any]], rank: int, net: str) -> set[int]:
    """The peers to reach over ib (pure; both sides of a pair compute the same answer)."""
    if net == "socket":
        return set()
    me = peers[rank]
    out = set()
    for j, p in enumerate(peers):
        if j == rank:
            continue
        both = bool(me.get("ib")) and me.get("ib") == p.get("ib")
        if net == "ib":
            if not both:
                bad = j if me.get("ib") else rank
                why = peers[bad].get("ib_reason") or "it runs an aioccl without ib"
                if me.get("ib") and p.get("ib"):
                    why = f"backends differ ({me['ib']} here, {p['ib']} on rank {j})"
                raise BootstrapError(f"AIOCCL_NET=ib but rank {bad} cannot use ib: {why}")
            out.add(j)
        elif both and p.get("host") != me.get("host"):
            out.add(j)
    return out


def open_device(v: Verdict, cqe: int, s: Settings) -> Device:
    choice = v.ports[0]
    if v.backend == "loopback":
        from .loopback import fabric

        return fabric().open(choice.device)
    from .pyverbs_backend import PyverbsDevice

    return PyverbsDevice(choice.device, choice.port, choice.gid_index, cqe,
                         {"timeout": s.timeout, "retry_cnt": s.retry_cnt, "sl": s.sl, "traffic_class": s.tc})


async def connect(w: Wiring, peers: set[int], v: Verdict, s: Settings) -> tuple[Port | None, dict[int, IbConnection]]:
    """Bring up a queue pair to each of ``peers``; returns the port and the pairs that made it."""
    depth = max(send_depth(s.nslots), recv_depth(s.nslots))
    port: Port | None = None
    why_not = ""
    try:
        port = Port(open_device(v, 2 * depth * len(peers) + 16, s), w.loop)
        port.start()
    except Exception as e:
        why_not = f"cannot open {v.ports[0].device}: {e!r}"
    conns: dict[int, IbConnection] = {}

    async def pair(j: int) -> None:
        sock = w.socks[j]
        conn, err = None, why_not
        try:
            if port is not None:
                conn = IbConnection(port, j + 1, j, w.sink, sock, port.device.create_qp(depth),
                                    s.nslots, s.slot, w.liveness)
                mine: dict[str, Any] = {"ep": conn.qp.endpoint().to_json(), **conn.fifo_info(),
                                        "nslots": s.nslots, "slot": s.slot}
            else:
                mine = {"fail": err}
        except Exception as e:
            err, mine = f"{e!r}", {"fail": f"{e!r}"}
        await send_json(sock, mine)
        theirs = await recv_json(sock)
        ok = conn is not None
        if ok and "fail" in theirs:
            ok, err = False, f"rank {j}: {theirs['fail']}"
        elif ok and (theirs["nslots"], theirs["slot"]) != (s.nslots, s.slot):
            ok, err = False, (f"slot settings differ: {s.nslots} x {s.slot} B here, {theirs['nslots']} x "
                              f"{theirs['slot']} B on rank {j} (set AIOCCL_IB_SLOTS/BUFFSIZE alike)")
        if ok:
            assert conn is not None
            try:
                conn.connect(Endpoint.from_json(theirs["ep"]), int(theirs["fifo"]), int(theirs["rkey"]))
            except Exception as e:
                ok, err = False, f"connecting the queue pair failed: {e!r}"
        await send_json(sock, {"ok": ok, "why": err})
        answer = await recv_json(sock)
        if ok and not answer.get("ok"):
            ok, err = False, f"rank {j}: {answer.get('why')}"
        if ok:
            assert conn is not None
            conns[j] = conn
            return
        if conn is not None:
            conn._release()
        if s.net == "ib":
            raise BootstrapError(f"AIOCCL_NET=ib: ib to rank {j} failed: {err}")
        _log.warning("ib to rank %d failed, using TCP for this pair: %s", j, err)

    try:
        async with asyncio.timeout(w.timeout):
            await asyncio.gather(*(pair(j) for j in sorted(peers)))
    except BaseException:
        for c in conns.values():
            c._release()
        if port is not None:
            port.close()
        raise
    if not conns and port is not None:
        port.close()
        port = None
    if conns:
        _log.info("ib: %d peer(s) over %s (%d x %d B slots each way)", len(conns), v.ports[0].device,
                  s.nslots, s.slot)
    return port, conns


class IbSetup:
    """ib as a row of the transports' table (``transport/pairing.py``): its settings and port detection are
    read once, when the engine is made; keeps the port it opened."""

    name = "ib"

    def __init__(self, env: Mapping[str, str] = os.environ) -> None:
        self.settings = settings(env)
        self.verdict = detect()
        self.port: Port | None = None

    def hello(self) -> dict[str, Any]:
        return hello(self.verdict)

    def choose(self, peers: list[dict[str, Any]], rank: int, taken: set[int]) -> set[int]:
        return choose(peers, rank, self.settings.net) - taken

    async def connect(self, w: Wiring, peers: set[int]) -> dict[int, Any]:
        self.port, conns = await connect(w, peers, self.verdict, self.settings)
        return dict(conns)
