"""The rank side of bootstrap: meet at the root, then connect the full mesh.

1. listen on the chosen local address (port 0);
2. connect to the root (retrying until the deadline: the root may start
   later than us), prove the secret, send our address and host identity,
   and receive everyone's;
3. connect to every lower rank and accept from every higher one; each data
   connection is authenticated too, then names its comm id, its rank and
   which of the pair's streams it is (a pair may use several: ``streams``).

A connection that breaks before it is proven (a root or acceptor under a flood
evicts, resets or never answers) is tried again with backoff until the
deadline: a flood delays a rank, it does not fail it. Only answers that
cannot change are final: a refused secret, a port held by a program that does
not speak aioccl, a root known to have exited.
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
from .admission import FIRST_BYTES_S, HANDSHAKE_S, Admission, DropLog, accept_forever, reason_of
from .netif import local_address
from .sockio import Closed, json_frame, recv_json, tune
from .unique_id import UniqueId

_log = log.get("BOOTSTRAP")
MAX_HANDSHAKES = 64  # connections in the handshake at once; one more evicts the oldest unauthenticated
ATTEMPT_S = 5.0  # one try at a handshake; a server that says nothing for this long is tried again
NOT_AIOCCL = ("something else listens on that port and does not speak aioccl's handshake (another program "
              "took the port, or the address is wrong)")


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
    stripes: dict[int, list[socket.socket]]  # peer rank -> its extra streams, when the pair has several


Streams = Callable[[list[dict[str, Any]], int, int], int]  # (table, rank i, rank j) -> streams, same both ways


STALE_ROOT = ("the root was listening when its id was published, so this id is stale: it belongs to an earlier "
              "run or restart whose root has exited (under torchrun, the store outlived that attempt)")
ROOT_GONE = "this rank met the root a moment ago, so it has exited since (its process died or gave up)"
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


class Acceptor:
    """This rank's listening socket, served from the moment it is bound.

    Every connection is authenticated concurrently, under ``admission.py``'s
    rules (at most ``MAX_HANDSHAKES`` in the handshake, the oldest stranger
    evicted for a newcomer), so a slow, silent or hostile stranger neither
    delays a real peer nor holds anything past its deadline. A connection that
    proves the secret and says hello is kept until the table from the root says
    which peers to expect; the same peer stream connecting again replaces it.
    """

    def __init__(self, listener: socket.socket, secret: bytes, rank: int) -> None:
        self.listener, self.secret, self.rank = listener, secret, rank
        self.comm_id: int | None = None
        self.expected: set[tuple[int, int]] = set()  # (rank, stream) of every connection to admit
        self.want: set[tuple[int, int]] = set()  # those still to arrive
        self.conns: dict[tuple[int, int], socket.socket] = {}
        self._table = asyncio.Event()
        self._arrived = asyncio.Event()
        self.drops = DropLog(_log, f"rank {rank}")
        self._admission = Admission(MAX_HANDSHAKES, self.drops)
        self._acceptor = asyncio.get_running_loop().create_task(
            accept_forever(listener, self._admission, self._admit))

    def expect(self, comm_id: int, want: set[tuple[int, int]]) -> None:
        self.comm_id, self.want, self.expected = comm_id, set(want), set(want)
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
        self._admission.cancel_all()
        self.drops.flush()

    async def _admit(self, sock: socket.socket, who: Any) -> None:
        ok = False
        try:
            tune(sock)
            await auth.as_server(sock, self.secret, timeout=FIRST_BYTES_S)
            self._admission.proven(asyncio.current_task())
            async with asyncio.timeout(HANDSHAKE_S):
                hello = await recv_json(sock)
            j, comm_id, stream = int(hello["rank"]), int(hello["comm_id"]), int(hello.get("stream", 0))
            await self._table.wait()  # a peer that knows the secret may get the table before us
            if comm_id != self.comm_id or (j, stream) not in self.expected:
                raise ValueError(f"unexpected data connection {hello}")
            ok = True
        except (auth.AuthError, Closed, ValueError, KeyError, TypeError, OSError, TimeoutError) as e:
            self.drops.drop(who, reason_of(e), str(e) or repr(e))
            return
        finally:
            if not ok:
                sock.close()
        old = self.conns.pop((j, stream), None)
        if old is not None:  # the peer's first try broke on its side and it dialled again
            old.close()
        self.conns[j, stream] = sock
        self.want.discard((j, stream))
        if not self.want:
            self._arrived.set()


async def join(uid: UniqueId, rank: int, world_size: int, timeout: float,
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
    acceptor = Acceptor(listener, uid.secret, rank)
    try:
        hello = {"rank": rank, "world_size": world_size, "addr": addr, "port": listener.getsockname()[1],
                 "host": host_identity(), "pid": os.getpid(), **(extra or {})}
        reply = await _ask_root(uid, rank, hello, deadline)
        if not reply.get("ok"):
            raise BootstrapError(f"rank {rank}: the root refused: {reply.get('error')}")
        comm_id, peers = int(reply["comm_id"]), reply["peers"]
        _log.info("rank %d: got the table of %d ranks (comm %x)", rank, len(peers), comm_id)
        conns, stripes = await _mesh(acceptor, uid.secret, comm_id, rank, peers, deadline, streams)
        return Table(comm_id, peers, conns, stripes)
    finally:
        acceptor.close()
        listener.close()


async def _ask_root(uid: UniqueId, rank: int, hello: dict[str, Any], deadline: float) -> dict[str, Any]:
    """Register with the root and wait for its answer; a connection that breaks is made again (the root
    takes the same process's second hello in place of its first)."""
    stale = STALE_ROOT if uid.root_up else ""
    while True:
        root = await _meet(uid.host, uid.port, uid.secret, deadline, "the root", hello, stale, rank)
        stale = stale or ROOT_GONE  # it was up: this rank met it
        try:
            async with asyncio.timeout(max(0.1, deadline - time.monotonic()) + 1.0):
                return cast("dict[str, Any]", await recv_json(root))
        except ConnectionError as e:  # (Closed included) the root is gone or dropped us: join again
            if time.monotonic() >= deadline:
                raise BootstrapError(f"rank {rank}: meeting the root {uid.host}:{uid.port} failed: "
                                     f"{e!r}") from e
            _log.info("rank %d: the root's connection broke while it gathered the ranks (%r); joining again",
                      rank, e)
        except (OSError, TimeoutError) as e:
            raise BootstrapError(f"rank {rank}: meeting the root {uid.host}:{uid.port} failed: {e!r}") from e
        finally:
            root.close()


async def _meet(host: str, port: int, secret: bytes, deadline: float, what: str, hello: dict[str, Any],
                stale: str = "", rank: int = -1) -> socket.socket:
    """Connect, prove the secret and send ``hello`` (behind the answer: ``auth.as_client``); a try that breaks
    before that is done (evicted, reset, no answer within ``ATTEMPT_S``: a flooded server) is made again with
    backoff until ``deadline``."""
    delay, tries = 0.02, 0
    while True:
        sock = await _connect(host, port, deadline, what, stale)
        tries += 1
        try:
            # the hello rides with the answer to the challenge (a round trip less per connection)
            await auth.as_client(sock, secret, timeout=min(ATTEMPT_S, max(0.5, deadline - time.monotonic())),
                                 then=json_frame(hello))
            return sock
        except auth.SecretRefused as e:
            sock.close()
            raise BootstrapError(f"rank {rank}: {what} at {host}:{port} refused this rank's secret: every rank "
                                 f"must be given the same --secret (AIOCCL_COMM_SECRET) or unique id") from e
        except auth.AuthError as e:
            sock.close()
            raise BootstrapError(f"rank {rank}: {what} at {host}:{port}: {e}: {NOT_AIOCCL}") from e
        except (OSError, TimeoutError) as e:
            sock.close()
            if time.monotonic() + delay >= deadline:
                silent = (f"; it accepted but never sent aioccl's challenge within {ATTEMPT_S:g}s: {NOT_AIOCCL}, "
                          f"or it is flooded" if isinstance(e, TimeoutError) else "")
                raise BootstrapError(f"rank {rank}: no handshake with {what} at {host}:{port} before the deadline "
                                     f"in {tries} tries (last: {e!r}){silent}") from e
            if tries in (1, 10, 100):
                _log.info("rank %d: handshake with %s at %s:%d broke (%r); trying again", rank, what, host, port, e)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)


async def _mesh(acceptor: Acceptor, secret: bytes, comm_id: int, rank: int, peers: list[dict[str, Any]],
                deadline: float,
                streams: Streams | None) -> tuple[dict[int, socket.socket], dict[int, list[socket.socket]]]:
    """Dial every lower rank; the acceptor admits every higher one (each as many streams as the pair uses)."""
    n = len(peers)
    count = {j: streams(peers, rank, j) if streams is not None else 1 for j in range(n) if j != rank}
    got: dict[tuple[int, int], socket.socket] = {}

    async def dial(j: int, stream: int) -> None:
        p = peers[j]
        got[j, stream] = await _meet(p["addr"], p["port"], secret, deadline, f"rank {j}",
                                     {"comm_id": comm_id, "rank": rank, **({"stream": stream} if stream else {})},
                                     rank=rank)

    acceptor.expect(comm_id, {(j, s) for j in range(rank + 1, n) for s in range(count[j])})
    try:
        async with asyncio.timeout(max(0.1, deadline - time.monotonic())):
            accepted, *_ = await asyncio.gather(acceptor.arrived(), *(dial(j, s) for j in range(rank)
                                                                   for s in range(count[j])))
        got.update(cast("dict[tuple[int, int], socket.socket]", accepted))
    except (TimeoutError, BootstrapError, OSError, auth.AuthError, Closed) as e:
        for sk in [*got.values(), *acceptor.conns.values()]:
            sk.close()
        have = {*got, *acceptor.conns}
        missing = sorted(j for j in count if any((j, s) not in have for s in range(count[j])))
        raise BootstrapError(f"rank {rank}: could not connect to ranks {missing}: {e!r}") from e
    conns = {j: sk for (j, s), sk in got.items() if s == 0}
    stripes = {j: [got[j, s] for s in range(1, count[j])] for j in count if count[j] > 1}
    return conns, stripes
