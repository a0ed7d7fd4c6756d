"""The rank side of bootstrap: meet at the root, then connect the full mesh.

1. listen on the chosen local address (port 0);
2. connect to the root (retrying until the deadline: the root may start
   later than us), prove the secret, send our address and host identity,
   and receive everyone's;
3. connect to every lower rank and accept from every higher one; each data
   connection is authenticated too, then names its comm id and rank.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from .. import log
from ..errors import BootstrapError
from . import auth
from .netif import local_address
from .sockio import Closed, recv_json, send_json, tune
from .unique_id import UniqueId

_log = log.get("BOOTSTRAP")


def host_identity() -> str:
    """Ranks with equal identities share a host (and a network namespace)."""
    if os.environ.get("AIOCCL_HOSTID"):
        return os.environ["AIOCCL_HOSTID"]
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        netns = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        boot, netns = "", 0
    return f"{socket.gethostname()}/{boot}/{netns}"


@dataclass
class Table:
    comm_id: int
    peers: list[dict[str, Any]]  # per rank: addr, port, host, pid
    conns: dict[int, socket.socket]  # peer rank -> authenticated data socket


async def _connect(host: str, port: int, deadline: float, what: str) -> socket.socket:
    loop = asyncio.get_running_loop()
    delay, last = 0.01, None
    while time.monotonic() < deadline:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        tune(sock)
        try:
            async with asyncio.timeout(max(0.05, deadline - time.monotonic())):
                await loop.sock_connect(sock, (host, port))
            return sock
        except (OSError, TimeoutError) as e:
            sock.close()
            last = e
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.5)
    raise BootstrapError(f"could not connect to {what} at {host}:{port}: {last}")


async def rendezvous(uid: UniqueId, rank: int, world_size: int, timeout: float) -> Table:
    deadline = time.monotonic() + timeout
    addr = local_address(uid.host, uid.port, os.environ.get("AIOCCL_SOCKET_IFNAME"))
    listener = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((addr, 0))
    listener.listen(max(16, world_size))
    listener.setblocking(False)
    try:
        root = await _connect(uid.host, uid.port, deadline, "the root")
        try:
            await auth.as_client(root, uid.secret, timeout=max(1.0, deadline - time.monotonic()))
            await send_json(root, {"rank": rank, "world_size": world_size, "addr": addr,
                                   "port": listener.getsockname()[1], "host": host_identity(),
                                   "pid": os.getpid()})
            async with asyncio.timeout(max(0.1, deadline - time.monotonic()) + 1.0):
                reply = await recv_json(root)
        except (auth.AuthError, Closed, OSError, TimeoutError) as e:
            raise BootstrapError(f"rank {rank}: rendezvous with the root {uid.host}:{uid.port} failed: {e!r}") from e
        finally:
            root.close()
        if not reply.get("ok"):
            raise BootstrapError(f"rank {rank}: the root refused: {reply.get('error')}")
        comm_id, peers = int(reply["comm_id"]), reply["peers"]
        _log.info("rank %d: got the table of %d ranks (comm %x)", rank, len(peers), comm_id)
        conns = await _mesh(listener, uid.secret, comm_id, rank, peers, deadline)
        return Table(comm_id, peers, conns)
    finally:
        listener.close()


async def _mesh(listener: socket.socket, secret: bytes, comm_id: int, rank: int,
                peers: list[dict[str, Any]], deadline: float) -> dict[int, socket.socket]:
    loop = asyncio.get_running_loop()
    n = len(peers)
    conns: dict[int, socket.socket] = {}

    async def dial(j: int) -> None:
        p = peers[j]
        sock = await _connect(p["addr"], p["port"], deadline, f"rank {j}")
        try:
            await auth.as_client(sock, secret, timeout=max(1.0, deadline - time.monotonic()))
            await send_json(sock, {"comm_id": comm_id, "rank": rank})
        except BaseException:
            sock.close()
            raise
        conns[j] = sock

    async def accept_all() -> None:
        want = set(range(rank + 1, n))
        while want:
            sock, who = await loop.sock_accept(listener)
            tune(sock)
            try:
                await auth.as_server(sock, secret, timeout=10.0)
                async with asyncio.timeout(10.0):
                    hello = await recv_json(sock)
                j = int(hello["rank"])
                if int(hello["comm_id"]) != comm_id or j not in want:
                    raise ValueError(f"unexpected data connection {hello}")
            except (auth.AuthError, Closed, ValueError, KeyError, TypeError, OSError, TimeoutError) as e:
                _log.warning("rank %d: dropped a connection from %s: %s", rank, who, e)
                sock.close()
                continue
            conns[j] = sock
            want.discard(j)

    try:
        async with asyncio.timeout(max(0.1, deadline - time.monotonic())):
            await asyncio.gather(accept_all(), *(dial(j) for j in range(rank)))
    except (TimeoutError, BootstrapError, OSError, auth.AuthError, Closed) as e:
        for s in conns.values():
            s.close()
        missing = sorted(set(range(n)) - set(conns) - {rank})
        raise BootstrapError(f"rank {rank}: could not connect to ranks {missing}: {e!r}") from e
    return conns
