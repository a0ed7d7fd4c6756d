"""The rank side of bootstrap: meet at the root, then connect the full mesh.

1. listen on the chosen local address (port 0);
2. connect to the root (retrying until the deadline: the root may start
   later than us), prove the secret, send our address and host identity,
   and receive everyone's;
3. connect to every lower rank and accept from every higher one; each data
   connection is authenticated too, then names its comm id, its rank and
   which of the pair's streams it is (a pair may use several: ``streams``).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from .. import log
from ..errors import BootstrapError
from . import auth
from .netif import local_address
from .sockio import Closed, recv_json, send_json, tune
from .unique_id import UniqueId

_log = log.get("BOOTSTRAP")
HANDSHAKE_S = 10.0  # a connection must prove the secret and say hello within this
MAX_HANDSHAKES = 64  # connections being authenticated at once; more are dropped at once


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
    lanes: dict[int, list[socket.socket]]  # peer rank -> its extra streams, when the pair has several


Streams = Callable[[list[dict[str, Any]], int, int], int]  # (table, rank i, rank j) -> streams, same both ways


STALE_ROOT = ("the root was listening when its id was published, so this id is stale: it belongs to an earlier "
              "run or restart whose root has exited (under torchrun, the store outlived that attempt)")
REFUSED_TRIES = 5  # a root known to have been up: refused this often in a row (~0.3 s) means it is gone


async def _connect(host: str, port: int, deadline: float, what: str, stale: str = "") -> socket.socket:
    """Connect, retrying until ``deadline`` (the peer may not listen yet). With ``stale`` (why the peer
    must already be listening), a refused connection is final after a few tries: ``BootstrapError(stale)``."""
    loop = asyncio.get_running_loop()
    delay, last, refused = 0.01, None, 0
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
            refused = refused + 1 if isinstance(e, ConnectionRefusedError) else 0
            if stale and refused >= REFUSED_TRIES:
                raise BootstrapError(f"could not connect to {what} at {host}:{port}: {e}; {stale}") from None
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.5)
    raise BootstrapError(f"could not connect to {what} at {host}:{port}: {last}")


class Gate:
    """This rank's listening socket, served from the moment it is bound.

    Every connection is authenticated concurrently (at most
    ``MAX_HANDSHAKES`` at once, each within ``HANDSHAKE_S``), so
    a slow, silent or hostile stranger neither delays a real peer nor holds
    anything past its deadline; each one is logged once, with its address,
    and dropped. A connection that proves the secret and says hello is kept
    until the table from the root says which peers to expect.
    """

    def __init__(self, listener: socket.socket, secret: bytes, rank: int) -> None:
        self.listener, self.secret, self.rank = listener, secret, rank
        self.comm_id: int | None = None
        self.want: set[tuple[int, int]] = set()  # (rank, stream) still to arrive
        self.conns: dict[tuple[int, int], socket.socket] = {}
        self._table = asyncio.Event()
        self._arrived = asyncio.Event()
        self._pending: set[asyncio.Task[None]] = set()
        self._acceptor = asyncio.get_running_loop().create_task(self._accept_loop())

    def expect(self, comm_id: int, want: set[tuple[int, int]]) -> None:
        self.comm_id, self.want = comm_id, set(want)
        self._table.set()
        if not self.want:
            self._arrived.set()

    async def arrived(self) -> dict[tuple[int, int], socket.socket]:
        await self._arrived.wait()
        return self.conns

    def close(self) -> None:
        """Stop accepting (the caller closes the listener next: its reader must be gone first)."""
        self._acceptor.cancel()
        asyncio.get_running_loop().remove_reader(self.listener.fileno())
        for t in list(self._pending):
            t.cancel()

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            sock, who = await loop.sock_accept(self.listener)
            tune(sock)
            if len(self._pending) >= MAX_HANDSHAKES:
                _log.warning("rank %d: dropped a connection from %s: %d handshakes already in progress",
                             self.rank, who, MAX_HANDSHAKES)
                sock.close()
                continue
            t = loop.create_task(self._admit(sock, who))
            self._pending.add(t)
            t.add_done_callback(self._pending.discard)

    async def _admit(self, sock: socket.socket, who: Any) -> None:
        ok = False
        try:
            await auth.as_server(sock, self.secret, timeout=HANDSHAKE_S)
            async with asyncio.timeout(HANDSHAKE_S):
                hello = await recv_json(sock)
            j, comm_id, stream = int(hello["rank"]), int(hello["comm_id"]), int(hello.get("stream", 0))
            await self._table.wait()  # a peer that knows the secret may get the table before us
            if comm_id != self.comm_id or (j, stream) not in self.want:
                raise ValueError(f"unexpected data connection {hello}")
            ok = True
        except (auth.AuthError, Closed, ValueError, KeyError, TypeError, OSError, TimeoutError) as e:
            _log.warning("rank %d: dropped a connection from %s: %s", self.rank, who, e)
            return
        finally:
            if not ok:
                sock.close()
        self.conns[j, stream] = sock
        self.want.discard((j, stream))
        if not self.want:
            self._arrived.set()


async def rendezvous(uid: UniqueId, rank: int, world_size: int, timeout: float,
                     extra: dict[str, Any] | None = None, streams: Streams | None = None) -> Table:
    """``extra`` joins this rank's entry in the table every rank gets (e.g. what transports it can use);
    ``streams`` says from that table how many connections each pair opens (one when not given)."""
    deadline = time.monotonic() + timeout
    addr = local_address(uid.host, uid.port, os.environ.get("AIOCCL_SOCKET_IFNAME"))
    listener = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((addr, 0))
    listener.listen(max(128, world_size))
    listener.setblocking(False)
    _log.info("rank %d: listening for peers on %s:%d", rank, addr, listener.getsockname()[1])
    gate = Gate(listener, uid.secret, rank)
    try:
        root = await _connect(uid.host, uid.port, deadline, "the root",
                              STALE_ROOT if uid.root_up else "")
        try:
            await auth.as_client(root, uid.secret, timeout=max(1.0, deadline - time.monotonic()))
            await send_json(root, {"rank": rank, "world_size": world_size, "addr": addr,
                                   "port": listener.getsockname()[1], "host": host_identity(),
                                   "pid": os.getpid(), **(extra or {})})
            async with asyncio.timeout(max(0.1, deadline - time.monotonic()) + 1.0):
                reply = await recv_json(root)
        except auth.SecretRefused as e:
            raise BootstrapError(f"rank {rank}: the root at {uid.host}:{uid.port} refused this rank's secret: "
                                 f"every rank must be given the same --secret (AIOCCL_COMM_SECRET) or unique id"
                                 ) from e
        except (auth.AuthError, Closed, OSError, TimeoutError) as e:
            raise BootstrapError(f"rank {rank}: rendezvous with the root {uid.host}:{uid.port} failed: {e!r}") from e
        finally:
            root.close()
        if not reply.get("ok"):
            raise BootstrapError(f"rank {rank}: the root refused: {reply.get('error')}")
        comm_id, peers = int(reply["comm_id"]), reply["peers"]
        _log.info("rank %d: got the table of %d ranks (comm %x)", rank, len(peers), comm_id)
        conns, lanes = await _mesh(gate, uid.secret, comm_id, rank, peers, deadline, streams)
        return Table(comm_id, peers, conns, lanes)
    finally:
        gate.close()
        listener.close()


async def _mesh(gate: Gate, secret: bytes, comm_id: int, rank: int, peers: list[dict[str, Any]], deadline: float,
                streams: Streams | None) -> tuple[dict[int, socket.socket], dict[int, list[socket.socket]]]:
    """Dial every lower rank; the gate admits every higher one (each as many streams as the pair uses)."""
    n = len(peers)
    count = {j: streams(peers, rank, j) if streams is not None else 1 for j in range(n) if j != rank}
    got: dict[tuple[int, int], socket.socket] = {}

    async def dial(j: int, stream: int) -> None:
        p = peers[j]
        sock = await _connect(p["addr"], p["port"], deadline, f"rank {j}")
        try:
            await auth.as_client(sock, secret, timeout=max(1.0, deadline - time.monotonic()))
            await send_json(sock, {"comm_id": comm_id, "rank": rank, **({"stream": stream} if stream else {})})
        except BaseException:
            sock.close()
            raise
        got[j, stream] = sock

    gate.expect(comm_id, {(j, s) for j in range(rank + 1, n) for s in range(count[j])})
    try:
        async with asyncio.timeout(max(0.1, deadline - time.monotonic())):
            accepted, *_ = await asyncio.gather(gate.arrived(), *(dial(j, s) for j in range(rank)
                                                                   for s in range(count[j])))
        got.update(cast("dict[tuple[int, int], socket.socket]", accepted))
    except (TimeoutError, BootstrapError, OSError, auth.AuthError, Closed) as e:
        for sk in [*got.values(), *gate.conns.values()]:
            sk.close()
        have = {*got, *gate.conns}
        missing = sorted(j for j in count if any((j, s) not in have for s in range(count[j])))
        raise BootstrapError(f"rank {rank}: could not connect to ranks {missing}: {e!r}") from e
    conns = {j: sk for (j, s), sk in got.items() if s == 0}
    lanes = {j: [got[j, s] for s in range(1, count[j])] for j in count if count[j] > 1}
    return conns, lanes
