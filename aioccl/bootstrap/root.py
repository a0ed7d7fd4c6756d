"""The root every rank meets first: gathers every rank's address, then hands everyone the table.

One root serves one communicator. It runs on its own daemon thread and
event loop (like NCCL's bootstrap root thread), so it keeps serving no matter
what the ranks' loops are doing. Connections that fail the handshake or send
nonsense are dropped; a flood of them is bounded and costs the real ranks
nothing (``admission.py``), and the root keeps waiting for the real ranks.
Its deadline starts when the first rank arrives: if the rest do not come in
time, every waiting rank is told exactly which ranks are missing.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from typing import Any

from .. import log
from ..envvars import check_timeout, env_timeout
from . import auth
from .admission import FIRST_BYTES_S, HANDSHAKE_S, Admission, DropLog, accept_forever, reason_of, source
from .ports import bind_reusable
from .sockio import recv_json, send_json, tune

_log = log.get("BOOTSTRAP")
MAX_HANDSHAKES = 256  # connections in the handshake at once; one more evicts the oldest unauthenticated


class RootServer:
    def __init__(self, sock: socket.socket, secret: bytes, timeout: float | None = None) -> None:
        self.sock = sock
        self.secret = secret
        self.port = sock.getsockname()[1]
        self.timeout = env_timeout(os.environ) if timeout is None else check_timeout(timeout)
        self.thread: threading.Thread | None = None
        self.drops = DropLog(_log, "root")  # connections dropped (observable in tests: .total)
        self.wrong_secret: dict[str, int] = {}  # source address -> aioccl handshakes with another secret
        self._loop: asyncio.AbstractEventLoop | None = None
        self._complete: asyncio.Event | None = None
        self._abandoned = False

    @classmethod
    def bind(cls, host: str, port: int, secret: bytes, timeout: float | None = None) -> RootServer:
        sock = bind_reusable(host, port)  # a port aioccl-run reserved for it included (ports.py)
        sock.listen(512)
        sock.setblocking(False)
        return cls(sock, secret, timeout)

    def start_thread(self) -> None:
        self.thread = threading.Thread(target=lambda: asyncio.run(self.serve()), name="aioccl-root", daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Stop serving now (its rank gave up: ``init()`` was cancelled or failed), from any thread: the
        port, the sockets and the thread are released at once, so the same process can try again."""
        self._abandoned = True
        loop, complete = self._loop, self._complete
        if loop is not None and complete is not None:
            try:
                loop.call_soon_threadsafe(complete.set)
            except RuntimeError:  # its loop has ended already
                pass
        elif self.thread is None:
            self.sock.close()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout=5.0)

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        ranks: dict[int, tuple[socket.socket, dict[str, Any]]] = {}
        world: list[int] = []  # world size, fixed by the first rank
        complete = asyncio.Event()
        self._loop, self._complete = loop, complete
        if self._abandoned:
            complete.set()
        admission = Admission(MAX_HANDSHAKES, self.drops)

        async def handle(conn: socket.socket, peer: Any) -> None:
            keep = False
            try:
                tune(conn)
                await auth.as_server(conn, self.secret, timeout=FIRST_BYTES_S)
                admission.proven(asyncio.current_task())
                async with asyncio.timeout(HANDSHAKE_S):
                    hello = await recv_json(conn)
                rank, size = int(hello["rank"]), int(hello["world_size"])
                if not world:
                    world.append(size)
                    loop.call_later(self.timeout, complete.set)
                error = None
                if size != world[0]:
                    error = f"rank {rank} says world_size {size}, but earlier ranks said {world[0]}"
                elif not 0 <= rank < size:
                    error = f"rank {rank} is out of range for world_size {size}"
                elif rank in ranks and not _same_process(ranks[rank][1], hello):
                    error = f"rank {rank} joined twice (second time from {peer})"
                if error:
                    _log.warning("root: %s", error)
                    await send_json(conn, {"ok": False, "error": error})
                    return
                if rank in ranks:  # the same process again: its first connection broke on its side
                    ranks.pop(rank)[0].close()
                ranks[rank] = (conn, hello)
                keep = True
                _log.info("root: rank %d/%d arrived from %s", rank, size, peer)
                if len(ranks) == size:
                    complete.set()
            except (auth.AuthError, ValueError, KeyError, TypeError, OSError, TimeoutError) as e:
                secret = isinstance(e, auth.AuthError) and "secret" in str(e)
                if secret:
                    host = source(peer)
                    if host in self.wrong_secret or len(self.wrong_secret) < 64:  # bounded, whatever comes
                        self.wrong_secret[host] = self.wrong_secret.get(host, 0) + 1
                self.drops.drop(peer, "wrong secret" if secret else reason_of(e), str(e) or repr(e))
            finally:
                if not keep:
                    conn.close()

        acceptor = loop.create_task(accept_forever(self.sock, admission, handle))
        await complete.wait()
        acceptor.cancel()
        loop.remove_reader(self.sock.fileno())  # before close: a pending accept would see a dead fd
        self.sock.close()
        admission.cancel_all()
        self.drops.flush()
        if self._abandoned or not world:
            for conn, _ in ranks.values():
                conn.close()
            return
        size = world[0]
        if len(ranks) == size:
            comm_id = int.from_bytes(os.urandom(8), "little") >> 1
            table = [ranks[r][1] for r in range(size)]
            reply: dict[str, Any] = {"ok": True, "comm_id": comm_id, "peers": table}
        else:
            missing = sorted(set(range(size)) - set(ranks))
            reply = {"ok": False, "error": f"ranks {missing} of {size}{_nodes(missing)} did not reach the root "
                                           f"within {self.timeout:g}s (arrived: {sorted(ranks)})"
                                           f"{_wrong_secret(self.wrong_secret)}"}
            _log.warning("root: %s", reply["error"])
        for conn, _ in ranks.values():
            try:
                await send_json(conn, reply)
            except OSError as e:
                _log.warning("root: could not answer a rank: %s", e)
            finally:
                conn.close()


def _same_process(first: dict[str, Any], again: dict[str, Any]) -> bool:
    return all(first.get(k) == again.get(k) for k in ("pid", "host", "addr", "port"))


def _wrong_secret(sources: dict[str, int]) -> str:
    if not sources:
        return ""
    where = ", ".join(f"{host} ({n}x)" for host, n in sorted(sources.items()))
    return (f"; connections from {where} knew another secret: those ranks were given a different --secret "
            f"(AIOCCL_COMM_SECRET) or unique id")


def _nodes(missing: list[int]) -> str:
    """`` (node 2 of aioccl-run's)``: where the missing ranks were to start, when the launcher put the same
    number of ranks on every node (it says how many in AIOCCL_LOCAL_WORLD_SIZE)."""
    per = os.environ.get("AIOCCL_LOCAL_WORLD_SIZE", "")
    if not per.isdigit() or int(per) < 1:
        return ""
    nodes = sorted({r // int(per) for r in missing})
    return f" (node{'s' if len(nodes) > 1 else ''} {', '.join(map(str, nodes))} of aioccl-run's, {per} per node)"

