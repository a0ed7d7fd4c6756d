"""The real verbs backend, over pyverbs (Debian/Ubuntu: ``apt install python3-pyverbs``).

The builders (``sges()``, ``write_wr()``, ``send_wr()``,
``recv_wr()``, ``rts_attr()``, ``completion()``) are pure functions of
pyverbs objects, unit-tested wherever pyverbs imports; ``PyverbsDevice``
is the thin part that needs a NIC.

pyverbs (rdma-core 44) does not expose the completion channel's fd, which the
event loop must watch; ``_new_fd()`` finds it as the one
``anon_inode:[infinibandevent]`` descriptor that creating the channel added
(newer pyverbs versions that offer ``.fd`` are used directly).
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import threading
from collections.abc import Callable
from typing import Any

from .verbs import WC_RECV, WC_RECV_IMM, WC_SEND, WC_WRITE, Completion, Endpoint, Piece, Region

ACCESS = 1 | 2 | 4  # IBV_ACCESS_LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ
_fd_lock = threading.Lock()


def _e() -> Any:
    import pyverbs.enums as e

    return e


def sges(pieces: list[Piece]) -> list[Any]:
    from pyverbs.wr import SGE

    return [SGE(p.region.addr + p.offset, p.length, p.region.lkey) for p in pieces]


def write_wr(wr_id: int, pieces: list[Piece], raddr: int, rkey: int, imm: int) -> Any:
    """RDMA WRITE WITH IMMEDIATE, signaled; the immediate goes in network byte order, as verbs carry it."""
    from pyverbs.wr import SendWR

    e = _e()
    wr = SendWR(wr_id=wr_id, opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=len(pieces), sg=sges(pieces),
                send_flags=e.IBV_SEND_SIGNALED, imm_data=socket.htonl(imm))
    wr.set_wr_rdma(rkey, raddr)
    return wr


def send_wr(wr_id: int, pieces: list[Piece]) -> Any:
    from pyverbs.wr import SendWR

    e = _e()
    return SendWR(wr_id=wr_id, opcode=e.IBV_WR_SEND, num_sge=len(pieces), sg=sges(pieces),
                  send_flags=e.IBV_SEND_SIGNALED)


def recv_wr(wr_id: int, pieces: list[Piece]) -> Any:
    from pyverbs.wr import RecvWR

    return RecvWR(wr_id=wr_id, num_sge=len(pieces), sg=sges(pieces))


def rts_attr(port: int, gid_index: int, mine: Endpoint, remote: Endpoint, *, timeout: int = 20,
             retry_cnt: int = 7, sl: int = 0, traffic_class: int = 0) -> Any:
    """The attributes for INIT -> RTR -> RTS: the remote QP, PSNs, path (GRH when there is a GID), MTU."""
    from pyverbs.addr import GID, AHAttr, GlobalRoute
    from pyverbs.qp import QPAttr

    attr = QPAttr(port_num=port)
    attr.qp_access_flags = ACCESS
    attr.path_mtu = min(mine.mtu, remote.mtu)
    attr.dest_qp_num = remote.qpn
    attr.rq_psn = remote.psn
    attr.sq_psn = mine.psn
    attr.timeout = timeout
    attr.retry_cnt = retry_cnt
    attr.rnr_retry = 7  # infinite: credits make RNR impossible unless the peer is wedged
    attr.min_rnr_timer = 12
    attr.max_rd_atomic = 1
    attr.max_dest_rd_atomic = 1
    if remote.gid and int(remote.gid.replace(":", ""), 16):
        gr = GlobalRoute(dgid=GID(remote.gid), sgid_index=gid_index)
        gr.traffic_class = traffic_class
        attr.ah_attr = AHAttr(port_num=port, is_global=1, gr=gr, dlid=remote.lid, sl=sl)
    else:
        attr.ah_attr = AHAttr(port_num=port, is_global=0, dlid=remote.lid, sl=sl)
    return attr


def status_str(status: int) -> str:
    try:
        from pyverbs.cq import cqe_status_to_str

        return str(cqe_status_to_str(status))
    except Exception:  # older pyverbs
        return f"status {status}"


def completion(wc: Any) -> Completion:
    e = _e()
    ops = {e.IBV_WC_SEND: WC_SEND, e.IBV_WC_RDMA_WRITE: WC_WRITE, e.IBV_WC_RECV: WC_RECV,
           e.IBV_WC_RECV_RDMA_WITH_IMM: WC_RECV_IMM}
    if wc.status != e.IBV_WC_SUCCESS:
        # an error completion's opcode is undefined; the wr_id says what it was
        return Completion(wc.wr_id, WC_RECV, error=f"{status_str(wc.status)} (vendor error {wc.vendor_err:#x})")
    op = ops.get(wc.opcode, f"opcode {wc.opcode}")
    imm = socket.ntohl(wc.imm_data) if op == WC_RECV_IMM else None
    return Completion(wc.wr_id, op, wc.byte_len, imm)


def _new_fd(make: Callable[[], Any]) -> tuple[Any, int]:
    """Create the completion channel and find its fd (see the module docstring)."""
    with _fd_lock:
        before = set(os.listdir("/proc/self/fd"))
        obj = make()
        fd = getattr(obj, "fd", None)
        if isinstance(fd, int):
            return obj, fd
        found = []
        for name in set(os.listdir("/proc/self/fd")) - before:
            try:
                if "infinibandevent" in os.readlink(f"/proc/self/fd/{name}"):
                    found.append(int(name))
            except OSError:
                continue
    if len(found) != 1:
        raise OSError(f"cannot find the completion channel's fd (candidates {found})")
    return obj, found[0]


class PyverbsQp:
    def __init__(self, dev: PyverbsDevice, depth: int) -> None:
        from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr

        e = _e()
        self.dev = dev
        cap = QPCap(max_send_wr=depth, max_recv_wr=depth, max_send_sge=2, max_recv_sge=1)
        init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=dev.cq, rcq=dev.cq, cap=cap)
        attr = QPAttr(port_num=dev.port)
        attr.qp_access_flags = ACCESS
        self.qp = QP(dev.pd, init, attr)  # with an attr hint pyverbs takes an RC QP to INIT
        self.psn = random.getrandbits(24)

    def endpoint(self) -> Endpoint:
        return Endpoint(self.qp.qp_num, self.psn, self.dev.lid, self.dev.gid, self.dev.mtu)

    def connect(self, remote: Endpoint) -> None:
        self.qp.to_rts(rts_attr(self.dev.port, self.dev.gid_index, self.endpoint(), remote,
                                **self.dev.path_options))

    def post_write_imm(self, wr_id: int, pieces: list[Piece], raddr: int, rkey: int, imm: int) -> None:
        self.qp.post_send(write_wr(wr_id, pieces, raddr, rkey, imm), None)

    def post_send(self, wr_id: int, pieces: list[Piece]) -> None:
        self.qp.post_send(send_wr(wr_id, pieces), None)

    def post_recv(self, wr_id: int, pieces: list[Piece]) -> None:
        self.qp.post_recv(recv_wr(wr_id, pieces), None)

    def close(self) -> None:
        self.qp.close()


class PyverbsDevice:
    """One port of one device: PD, a completion channel and one CQ (``cqe`` entries)."""

    def __init__(self, name: str, port: int, gid_index: int, cqe: int,
                 path_options: dict[str, int] | None = None) -> None:
        from pyverbs.cq import CQ, CompChannel
        from pyverbs.device import Context
        from pyverbs.pd import PD

        self.name, self.port, self.gid_index = name, port, gid_index
        self.path_options = path_options or {}
        self.ctx = Context(name=name)
        self.pd = PD(self.ctx)
        self.channel, self._fd = _new_fd(lambda: CompChannel(self.ctx))
        fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        self.cq = CQ(self.ctx, cqe, None, self.channel, 0)
        pa = self.ctx.query_port(port)
        self.lid, self.mtu = int(pa.lid), int(pa.active_mtu)
        self.gid = str(self.ctx.query_gid(port, gid_index))
        self._mrs: dict[int, Any] = {}
        self._unacked = 0

    def register(self, addr: int, length: int) -> Region:
        from pyverbs.mr import MR

        mr = MR(self.pd, length, ACCESS, address=addr)
        self._mrs[mr.lkey] = mr
        return Region(addr, length, mr.lkey, mr.rkey)

    def deregister(self, region: Region) -> None:
        mr = self._mrs.pop(region.lkey, None)
        if mr is not None:
            mr.close()

    def create_qp(self, depth: int) -> PyverbsQp:
        return PyverbsQp(self, depth)

    def fileno(self) -> int:
        return self._fd

    def arm(self) -> None:
        from pyverbs.pyverbs_error import PyverbsError

        while True:  # consume every pending event (the fd is non-blocking: EAGAIN ends it)
            try:
                self.channel.get_cq_event(self.cq)
            except PyverbsError:
                break
            self._unacked += 1
        if self._unacked >= 64:
            self.cq.ack_events(self._unacked)
            self._unacked = 0
        self.cq.req_notify()

    def poll(self, budget: int) -> list[Completion]:
        _n, wcs = self.cq.poll(budget)
        return [completion(wc) for wc in wcs]

    def close(self) -> None:
        if self._unacked:
            self.cq.ack_events(self._unacked)
            self._unacked = 0
        for mr in self._mrs.values():
            mr.close()
        self._mrs.clear()
        self.cq.close()
        self.channel.close()
        self.pd.close()
        self.ctx.close()
