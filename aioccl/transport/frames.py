"""The data-frame header, as pure encode/decode functions.

Every message on a data connection is a 32-byte header followed by
``nbytes`` of payload. The header names the op it belongs to (context,
sequence number or tag, message index) and what it carries (op kind code,
dtype code), so a receiver can match it to a posted receive, or name a
mismatch precisely.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

HEADER = struct.Struct("<BBBBIQqQ")  # kind, op, dtype, flags, k, ctx, seq_or_tag, nbytes
HEADER_SIZE = HEADER.size  # 32

COLL, P2P, BYE = 1, 2, 3
KIND_NAMES = {COLL: "collective", P2P: "p2p", BYE: "bye"}


@dataclass(frozen=True, slots=True)
class Header:
    kind: int
    op: int  # collective code (or 0)
    dtype: int  # dtypes.dtype_code (or 0)
    k: int  # index of the message within the op, per (src, dst) pair
    ctx: int  # communicator context id
    seq: int  # collective sequence number, or p2p tag
    nbytes: int

    def pack(self) -> bytes:
        return HEADER.pack(self.kind, self.op, self.dtype, 0, self.k, self.ctx, self.seq, self.nbytes)


def unpack(buf: bytes | bytearray | memoryview) -> Header:
    kind, op, dtype, _flags, k, ctx, seq, nbytes = HEADER.unpack(buf)
    if kind not in KIND_NAMES:
        raise ValueError(f"corrupt frame: unknown kind {kind}")
    return Header(kind, op, dtype, k, ctx, seq, nbytes)
