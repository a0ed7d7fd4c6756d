"""Exact-length reads and writes on non-blocking sockets, and length-prefixed JSON.

Bootstrap and data connections both use raw non-blocking sockets driven by
the loop's ``sock_*`` methods (no asyncio transports), so the data path can
later receive straight into user buffers on the very same socket.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from typing import Any

MAX_JSON = 1 << 20


class Closed(ConnectionError):
    """The peer closed the connection."""


async def recv_exact(sock: socket.socket, view: memoryview) -> None:
    loop = asyncio.get_running_loop()
    got, n = 0, len(view)
    while got < n:
        r = await loop.sock_recv_into(sock, view[got:])
        if r == 0:
            raise Closed("connection closed by peer")
        got += r


async def recv_bytes(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    await recv_exact(sock, memoryview(buf))
    return bytes(buf)


def json_frame(obj: Any) -> bytes:
    """``obj`` as JSON behind its length: what ``send_json`` sends and ``recv_json`` reads."""
    data = json.dumps(obj).encode()
    return struct.pack("<I", len(data)) + data


async def send_json(sock: socket.socket, obj: Any) -> None:
    await asyncio.get_running_loop().sock_sendall(sock, json_frame(obj))


async def recv_json(sock: socket.socket) -> Any:
    (n,) = struct.unpack("<I", await recv_bytes(sock, 4))
    if n > MAX_JSON:
        raise ValueError(f"bootstrap message of {n} bytes is too large")
    return json.loads(await recv_bytes(sock, n))


def tune(sock: socket.socket) -> None:
    sock.setblocking(False)
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
