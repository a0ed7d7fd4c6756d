"""The loopback verbs backend: a test of the ib *protocol*, not of a NIC.

Every device opened in this process sits on one in-process ``Fabric``.
A worker thread plays the NIC: it executes each queue pair's work requests in
order (RC semantics), copies bytes between registered regions with
``memmove`` after checking keys and bounds as a NIC would, consumes posted
receives, and appends completions to the completion queues, whose channel is
an ``eventfd`` armed and re-armed exactly like a verbs completion channel.
Communicators created in one process with ``AIOCCL_IB_BACKEND=loopback``
therefore run the whole ib transport (chunking, credits, immediates,
completion events, errors) with no RDMA hardware.

``Faults`` injects what real fabrics do on a bad day: delayed
completions, completions reordered, a remote access error on the n-th write,
receives posted late (receiver not ready, retried like ``rnr_retry``), and a
retry budget after which the sender sees the error.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from .verbs import WC_RECV, WC_RECV_IMM, WC_SEND, WC_WRITE, Completion, Endpoint, Piece, Region

RNR_DELAY_S = 0.001


@dataclass
class Faults:
    delay_s: float = 0.0  # every work request executes this late
    reorder: bool = False  # poll() hands out what it has in a shuffled order
    access_error_at: int | None = None  # the n-th RDMA write (1-based, fabric-wide) fails with a remote access error
    recv_delay_s: float = 0.0  # posted receives become usable this late: the peer sees "receiver not ready"
    rnr_retry: int | None = None  # RNR retries before the error; None: forever (rnr_retry=7 on a real NIC)
    seed: int = 0
    writes: int = field(default=0, init=False)


class LoopbackError(RuntimeError):
    """A misuse a real NIC would refuse at post time (bad key, queue full, not connected)."""


class Fabric:
    def __init__(self) -> None:
        self.faults = Faults()
        self.lock = threading.Condition()
        self.qps: dict[int, LoopQp] = {}
        self.regions: dict[int, Region] = {}  # rkey -> region (rkey == lkey here)
        self._keys = itertools.count(0x1000)
        self._qpns = itertools.count(0x100)
        self._rng = random.Random(0)
        self._thread: threading.Thread | None = None

    def reset(self, faults: Faults | None = None) -> None:
        with self.lock:
            self.faults = faults or Faults()
            self._rng = random.Random(self.faults.seed)

    def open(self, name: str = "loop0") -> LoopDevice:
        with self.lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="aioccl-loopback-nic", daemon=True)
                self._thread.start()
        return LoopDevice(self, name)

    # -- the "NIC" -----------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self.lock:
                now = time.monotonic()
                wake = now + 1.0
                for qp in list(self.qps.values()):
                    while qp.sq and qp.sq[0][0] <= now and qp.retry_at <= now:
                        if not self._execute(qp, now):
                            break
                    if qp.sq:
                        wake = min(wake, max(qp.sq[0][0], qp.retry_at))
                self.lock.wait(max(0.0, wake - time.monotonic()))

    def _execute(self, qp: LoopQp, now: float) -> bool:
        """Run the head work request of ``qp``; False when it must wait (receiver not ready)."""
        _due, wr_id, opcode, pieces, raddr, rkey, imm = qp.sq[0]
        if qp.error is not None:
            qp.sq.popleft()
            qp.dev.complete(Completion(wr_id, opcode, error="work request flushed (QP in error)"))
            return True
        peer = self.qps.get(qp.remote_qpn or -1)
        if peer is None:
            self._fail(qp, Completion(wr_id, opcode, error="transport retry counter exceeded (peer QP is gone)"))
            return True
        total = sum(p.length for p in pieces)
        if opcode == WC_WRITE:
            f = self.faults
            f.writes += 1
            target = self.regions.get(rkey)
            if f.access_error_at == f.writes or target is None or not target.contains(raddr, total):
                self._fail(qp, Completion(wr_id, opcode, error="remote access error"))
                return True
        recv = peer.take_recv(now)
        if recv is None:
            qp.rnr += 1
            if self.faults.rnr_retry is not None and qp.rnr > self.faults.rnr_retry:
                self._fail(qp, Completion(wr_id, opcode, error="receiver not ready: RNR retry counter exceeded"))
                return True
            qp.retry_at = now + RNR_DELAY_S
            return False
        qp.rnr = 0
        qp.sq.popleft()
        if opcode == WC_WRITE:
            dst = raddr
            for p in pieces:
                ctypes.memmove(dst, p.region.addr + p.offset, p.length)
                dst += p.length
            peer.dev.complete(Completion(recv[0], WC_RECV_IMM, total, imm))
        else:
            room = sum(p.length for p in recv[1])
            if total > room:
                self._fail(qp, Completion(wr_id, opcode, error=f"remote invalid request: {total} bytes into a "
                                                               f"{room}-byte receive"))
                return True
            data = b"".join(ctypes.string_at(p.region.addr + p.offset, p.length) for p in pieces)
            at = 0
            for p in recv[1]:
                n = min(p.length, total - at)
                ctypes.memmove(p.region.addr + p.offset, data[at:at + n], n)
                at += n
            peer.dev.complete(Completion(recv[0], WC_RECV, total))
        qp.dev.complete(Completion(wr_id, opcode, total))
        return True

    def _fail(self, qp: LoopQp, c: Completion) -> None:
        qp.sq.popleft()
        qp.error = c.error
        qp.dev.complete(c)

    def shuffle(self, items: list[Completion]) -> None:
        self._rng.shuffle(items)


class LoopQp:
    def __init__(self, dev: LoopDevice, depth: int) -> None:
        self.dev, self.depth = dev, depth
        fab = dev.fabric
        self.qpn = next(fab._qpns)
        self.psn = random.getrandbits(24)
        self.remote_qpn: int | None = None
        self.sq: deque[tuple[float, int, str, list[Piece], int, int, int]] = deque()
        self.rq: deque[tuple[float, int, list[Piece]]] = deque()
        self.retry_at = 0.0
        self.rnr = 0
        self.error: str | None = None
        with fab.lock:
            fab.qps[self.qpn] = self

    def endpoint(self) -> Endpoint:
        return Endpoint(self.qpn, self.psn, 0, f"loopback:{os.getpid()}", 5)

    def connect(self, remote: Endpoint) -> None:
        if not remote.gid.startswith("loopback:"):
            raise LoopbackError(f"loopback QP cannot connect to a real endpoint {remote}")
        self.remote_qpn = remote.qpn

    def _check(self, pieces: list[Piece]) -> None:
        for p in pieces:
            r = self.dev.fabric.regions.get(p.region.lkey)
            if r is None or not r.contains(p.region.addr + p.offset, p.length):
                raise LoopbackError(f"local protection error: {p} is not inside a registered region")

    def _post(self, wr_id: int, opcode: str, pieces: list[Piece], raddr: int, rkey: int, imm: int) -> None:
        fab = self.dev.fabric
        with fab.lock:
            if self.remote_qpn is None:
                raise LoopbackError("post_send on a QP that is not connected (not in RTS)")
            if len(self.sq) >= self.depth:
                raise LoopbackError(f"send queue full ({self.depth} work requests)")
            self._check(pieces)
            self.sq.append((time.monotonic() + fab.faults.delay_s, wr_id, opcode, pieces, raddr, rkey, imm))
            fab.lock.notify()

    def post_write_imm(self, wr_id: int, pieces: list[Piece], raddr: int, rkey: int, imm: int) -> None:
        self._post(wr_id, WC_WRITE, pieces, raddr, rkey, imm)

    def post_send(self, wr_id: int, pieces: list[Piece]) -> None:
        self._post(wr_id, WC_SEND, pieces, 0, 0, 0)

    def post_recv(self, wr_id: int, pieces: list[Piece]) -> None:
        fab = self.dev.fabric
        with fab.lock:
            if len(self.rq) >= self.depth:
                raise LoopbackError(f"receive queue full ({self.depth} work requests)")
            self._check(pieces)
            self.rq.append((time.monotonic() + fab.faults.recv_delay_s, wr_id, pieces))
            fab.lock.notify()

    def take_recv(self, now: float) -> tuple[int, list[Piece]] | None:
        if self.rq and self.rq[0][0] <= now:
            _t, wr_id, pieces = self.rq.popleft()
            return wr_id, pieces
        return None

    def close(self) -> None:
        with self.dev.fabric.lock:
            self.dev.fabric.qps.pop(self.qpn, None)


class LoopDevice:
    def __init__(self, fabric: Fabric, name: str) -> None:
        self.fabric, self.name = fabric, name
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._cq: list[Completion] = []
        self._armed = False
        self._regions: list[Region] = []

    def register(self, addr: int, length: int) -> Region:
        with self.fabric.lock:
            key = next(self.fabric._keys)
            r = Region(addr, length, key, key)
            self.fabric.regions[key] = r
        self._regions.append(r)
        return r

    def deregister(self, region: Region) -> None:
        with self.fabric.lock:
            self.fabric.regions.pop(region.rkey, None)
        if region in self._regions:
            self._regions.remove(region)

    def create_qp(self, depth: int) -> LoopQp:
        return LoopQp(self, depth)

    def fileno(self) -> int:
        return self._fd

    def complete(self, c: Completion) -> None:
        """Called by the fabric's thread with its lock held."""
        self._cq.append(c)
        if self._armed:
            self._armed = False
            try:
                os.eventfd_write(self._fd, 1)
            except OSError:  # closed
                pass

    def arm(self) -> None:
        try:
            os.eventfd_read(self._fd)
        except BlockingIOError:
            pass
        with self.fabric.lock:
            self._armed = True

    def poll(self, budget: int) -> list[Completion]:
        with self.fabric.lock:
            got, self._cq = self._cq[:budget], self._cq[budget:]
            if self.fabric.faults.reorder and len(got) > 1:
                self.fabric.shuffle(got)
        return got

    def close(self) -> None:
        for r in list(self._regions):
            self.deregister(r)
        try:
            os.close(self._fd)
        except OSError:
            pass


_FABRIC: Fabric | None = None


def fabric() -> Fabric:
    """The process's loopback fabric (created on first use)."""
    global _FABRIC
    if _FABRIC is None:
        _FABRIC = Fabric()
    return _FABRIC
