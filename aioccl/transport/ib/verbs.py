"""The verbs-backend interface: the few verbs the ib transport uses, and nothing else.

The protocol (``protocol.py``) and the connection (``connection.py``) speak
only this interface, so they run unchanged over the real NIC
(``pyverbs_backend.py``) and over the in-process test backend
(``loopback.py``). It is deliberately narrow: one protection domain and one
completion queue per device, RC queue pairs, registered regions, RDMA WRITE
WITH IMMEDIATE, SEND, RECV, and a completion channel whose file descriptor
the event loop watches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# completion opcodes (the transport's own names; backends translate theirs)
WC_SEND, WC_WRITE, WC_RECV, WC_RECV_IMM = "send", "write", "recv", "recv-imm"


@dataclass(frozen=True)
class Region:
    """A registered memory region: ``addr`` is the virtual address of its first byte."""

    addr: int
    length: int
    lkey: int
    rkey: int

    def contains(self, addr: int, nbytes: int) -> bool:
        return self.addr <= addr and addr + nbytes <= self.addr + self.length


@dataclass(frozen=True)
class Piece:
    """One scatter/gather element: ``length`` bytes at ``offset`` into ``region``."""

    region: Region
    offset: int
    length: int


@dataclass(frozen=True)
class Endpoint:
    """What a peer needs to connect its queue pair to mine (sent over the bootstrap socket)."""

    qpn: int
    psn: int
    lid: int
    gid: str  # "fe80:0000:...", or "" on InfiniBand without a GRH
    mtu: int  # the port's active MTU as the verbs enum (1 = 256 B ... 5 = 4096 B)

    def to_json(self) -> dict[str, int | str]:
        return {"qpn": self.qpn, "psn": self.psn, "lid": self.lid, "gid": self.gid, "mtu": self.mtu}

    @classmethod
    def from_json(cls, d: dict[str, int | str]) -> Endpoint:
        return cls(int(d["qpn"]), int(d["psn"]), int(d["lid"]), str(d["gid"]), int(d["mtu"]))


@dataclass(frozen=True)
class Completion:
    """One work completion. ``error`` is None on success, else the status, named."""

    wr_id: int
    opcode: str  # WC_*
    byte_len: int = 0
    imm: int | None = None
    error: str | None = None


class QueuePair(Protocol):
    def endpoint(self) -> Endpoint: ...
    def connect(self, remote: Endpoint) -> None:
        """INIT -> RTR -> RTS against ``remote``."""
    def post_write_imm(self, wr_id: int, pieces: list[Piece], raddr: int, rkey: int, imm: int) -> None: ...
    def post_send(self, wr_id: int, pieces: list[Piece]) -> None: ...
    def post_recv(self, wr_id: int, pieces: list[Piece]) -> None: ...
    def close(self) -> None: ...


class Device(Protocol):
    """An opened port: its protection domain and its one completion queue with a channel."""

    name: str

    def register(self, addr: int, length: int) -> Region:
        """Register memory for local access, remote write and remote read."""
    def deregister(self, region: Region) -> None: ...
    def create_qp(self, depth: int) -> QueuePair: ...
    def fileno(self) -> int:
        """The completion channel's fd: readable once an armed CQ has a new completion."""
    def arm(self) -> None:
        """Consume pending channel events and request the next notification."""
    def poll(self, budget: int) -> list[Completion]: ...
    def close(self) -> None: ...
