"""One peer over an RC queue pair: the same frame transport as ``tcp.py``, moved by RDMA writes.

Memory: one region per connection, registered once at setup, holding my
receive FIFO (the peer writes into it), my send staging (one slot per FIFO
slot), and small buffers for credit messages. A payload that lies in a
region this engine registered (``comm.alloc``, scratch) is written straight
from where it lies (zero copy), and ``send`` returns only once those writes
have completed, since the caller may reuse the buffer next; any other payload
is copied into staging and ``send`` returns as soon as it is posted.

The bootstrap socket of the pair stays open beside the queue pair as a side
channel: it says goodbye on a graceful close, and its end (EOF, or the
kernel's keepalive verdict) reports a crashed or unreachable peer at once.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import numpy as np

from ... import log
from ...bootstrap.sockio import Closed
from ..frames import HEADER_SIZE
from ..reader import SideChannel, Sink
from ..tcp import TcpConnection
from .port import Port
from .protocol import (
    CREDIT,
    KIND_CREDIT_SEND,
    KIND_RECV,
    KIND_WRITE,
    ProtocolError,
    Reassembler,
    RecvWindow,
    SendWindow,
    chunk_plan,
    recv_depth,
    send_depth,
    wr_id,
)
from .verbs import WC_RECV_IMM, Completion, Endpoint, Piece, QueuePair

_log = log.get("NET")
ZERO_COPY_MIN = 64 << 10  # smaller payloads are cheaper to copy than to wait for their completions


class IbConnection:
    def __init__(self, port: Port, conn_id: int, peer: int, sink: Sink, sock: socket.socket, qp: QueuePair,
                 nslots: int, slot: int, liveness: float | None) -> None:
        self.port, self.id, self.peer, self.sink, self.qp = port, conn_id, peer, sink, qp
        self.loop = port.loop
        self.nslots, self.slot = nslots, slot
        self.side = TcpConnection(sock, peer, SideChannel("ib", lambda e, g: self._fail(f"side channel: {e}", g)),
                                  liveness)
        self.closed = False
        self.error: str | None = None
        self._credit_slots = send_depth(nslots) - nslots
        fifo = nslots * slot
        self._staging = fifo
        self._ctrl_recv = 2 * fifo
        self._ctrl_send = self._ctrl_recv + recv_depth(nslots) * CREDIT.size
        self.mem = np.zeros(self._ctrl_send + self._credit_slots * CREDIT.size, dtype=np.uint8)
        self.mv = self.mem.data
        self.region = port.register(self.mem.ctypes.data, self.mem.nbytes)
        self.tx = SendWindow(nslots)
        self.rx = RecvWindow(nslots)
        self.reasm = Reassembler(lambda h: sink.on_header(peer, h))
        self._lock = asyncio.Lock()
        self._waiters: list[asyncio.Future[None]] = []
        self._posted = 0
        self._written = 0
        self._credits_out = 0
        self._credit_seq = 0
        self.remote_fifo = 0
        self.remote_rkey = 0
        port.handlers[conn_id] = self
        for i in range(recv_depth(nslots)):
            self._post_recv(i)

    def fifo_info(self) -> dict[str, int]:
        return {"fifo": self.mem.ctypes.data, "rkey": self.region.rkey}

    def connect(self, remote: Endpoint, fifo: int, rkey: int) -> None:
        self.qp.connect(remote)
        self.remote_fifo, self.remote_rkey = fifo, rkey

    def start(self) -> None:
        self.side.start()

    # -- sending ---------------------------------------------------------------
    async def send(self, header: bytes, payload: memoryview | None) -> None:
        if self.closed:
            raise Closed(self.error or "connection already closed")
        n = len(payload) if payload is not None else 0
        src = np.frombuffer(payload, dtype=np.uint8) if payload is not None and n else None
        addr = src.ctypes.data if src is not None else 0
        direct = self.port.find(addr, n) if n >= ZERO_COPY_MIN else None
        async with self._lock:
            for i, (off, k) in enumerate(chunk_plan(n, self.slot)):
                while not self.tx.ready():
                    await self._wait()
                slot, imm = self.tx.take()
                base = self._staging + slot * self.slot
                at = base
                if i == 0:
                    self.mv[base:base + HEADER_SIZE] = header
                    at += HEADER_SIZE
                if direct is None:
                    if k:
                        assert src is not None
                        self.mem[at:at + k] = src[off:off + k]
                    pieces = [Piece(self.region, base, at - base + k)]
                else:
                    pieces = [Piece(self.region, base, at - base)] if at > base else []
                    pieces.append(Piece(direct, addr + off - direct.addr, k))
                self._post(self.qp.post_write_imm, wr_id(self.id, KIND_WRITE, slot), pieces,
                           self.remote_fifo + slot * self.slot, self.remote_rkey, imm)
                self._posted += 1
            if direct is not None:
                last = self._posted
                while self._written < last:
                    await self._wait()

    def _post(self, post: Callable[..., None], *args: Any) -> None:
        try:
            post(*args)
        except Exception as e:  # a verbs error at post time: the QP is unusable
            self._fail(f"post failed: {e}", False)
            raise Closed(self.error or str(e)) from None

    async def _wait(self) -> None:
        if self.closed:
            raise Closed(self.error or "connection closed")
        fut = self.loop.create_future()
        self._waiters.append(fut)
        await fut

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for f in waiters:
            if not f.done():
                f.set_result(None)

    # -- completions (called by the port) ---------------------------------------
    def on_completion(self, kind: int, index: int, c: Completion) -> None:
        if self.closed:
            return
        if c.error is not None:
            self._fail(f"{'RDMA write' if kind == KIND_WRITE else 'send' if kind == KIND_CREDIT_SEND else 'receive'}"
                       f" failed: {c.error}", False)
            return
        try:
            if kind == KIND_WRITE:
                self.tx.on_write_done(index)
                self._written += 1
                self._wake()
            elif kind == KIND_CREDIT_SEND:
                self._credits_out -= 1
            elif c.opcode == WC_RECV_IMM:
                self._post_recv(index)
                assert c.imm is not None
                for slot, nbytes in self.rx.on_write(c.imm, c.byte_len):
                    at = slot * self.slot
                    self.reasm.feed(self.mv[at:at + nbytes])
                    self.rx.release()
            else:
                at = self._ctrl_recv + index * CREDIT.size
                (freed,) = CREDIT.unpack_from(self.mv, at)
                self._post_recv(index)
                self.tx.on_credit(freed)
                self._wake()
        except ProtocolError as e:
            self._fail(f"protocol error: {e}", False)
        except Closed:
            pass

    def after_drain(self) -> None:
        """Return the freed slots in one credit message per drain (when one may go)."""
        if self.closed or self._credits_out >= self._credit_slots:
            return
        freed = self.rx.credit_due()
        if freed is None:
            return
        i = self._credit_seq % self._credit_slots
        self._credit_seq += 1
        at = self._ctrl_send + i * CREDIT.size
        CREDIT.pack_into(self.mv, at, freed)
        self._credits_out += 1
        try:
            self._post(self.qp.post_send, wr_id(self.id, KIND_CREDIT_SEND, i), [Piece(self.region, at, CREDIT.size)])
        except Closed:
            pass

    def _post_recv(self, index: int) -> None:
        at = self._ctrl_recv + index * CREDIT.size
        self._post(self.qp.post_recv, wr_id(self.id, KIND_RECV, index), [Piece(self.region, at, CREDIT.size)])

    # -- failure and teardown -----------------------------------------------------
    def _fail(self, why: str, graceful: bool) -> None:
        if self.closed:
            return
        graceful = graceful or self.side.bye_received
        self.error = f"ib connection to rank {self.peer}: {why}"
        _log.log(20 if graceful else 30, "%s", self.error)
        self._shut(self.error)
        self.side.abort()  # the peer learns at once (EOF) instead of at its deadline
        self.sink.on_lost(self.peer, Closed(self.error), graceful)

    def _shut(self, why: str) -> None:
        """Closed for good: wake every waiting sender with ``why``, give the QP and memory back."""
        self.closed = True
        waiters, self._waiters = self._waiters, []
        for f in waiters:
            if not f.done():
                f.set_exception(Closed(why))
        self._release()

    def _release(self) -> None:
        self.port.handlers.pop(self.id, None)
        self.qp.close()
        self.port.deregister(self.region)

    async def close(self, graceful: bool) -> None:
        if self.closed:
            return
        self.closed = True  # no new sends while the goodbye goes out
        await self.side.close(graceful)
        self._shut("connection closed")

    def abort(self, lost_first: int = -1, until: float | None = None) -> None:
        if self.closed:
            return
        self.side.abort(lost_first, until)
        self._shut("connection aborted")
