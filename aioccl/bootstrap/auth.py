"""Mutual HMAC challenge-response: every connection proves it knows the secret first.

The server speaks first (magic + nonce); the client answers with its own
nonce and ``HMAC(secret, "client" | nonce_s | nonce_c)``; the server checks it
(constant time) and proves itself with ``HMAC(secret, "server" | nonce_c |
nonce_s)``. The client's first message (``then``: its hello, which holds no secret) rides with its answer
instead of waiting a round trip for the proof; it trusts nothing it reads before the proof. Nothing else is
read by the server from a connection until the answer checks, and
every read has a deadline, so garbage, strangers and slow-loris peers are
dropped without disturbing the server. The secret never crosses the wire.
The pure functions below are the protocol; the two coroutines run it.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import socket

from .sockio import recv_bytes

MAGIC = b"AIOCCL\x01\x00"
NONCE = 16
MAC = 32
# what the server sends instead of its proof when the client's answer was wrong: the client can then say
# that its secret was refused rather than that the connection closed (it learns nothing else)
REFUSED = b"AIOCCL-SECRET-REFUSED".ljust(MAC, b"\0")


class AuthError(ConnectionError):
    """The other side failed to prove knowledge of the secret, or spoke garbage."""


class SecretRefused(AuthError):
    """The server checked this side's answer and found that the secrets differ."""


def _mac(secret: bytes, label: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(secret, label + a + b, hashlib.sha256).digest()


def challenge() -> tuple[bytes, bytes]:
    """(nonce, message to send)."""
    nonce = os.urandom(NONCE)
    return nonce, MAGIC + nonce


def answer(secret: bytes, message: bytes) -> tuple[bytes, bytes]:
    """Client: from the server's challenge, (client nonce, reply to send)."""
    if len(message) != len(MAGIC) + NONCE or not message.startswith(MAGIC):
        raise AuthError("server did not speak the aioccl handshake")
    nonce_s = message[len(MAGIC):]
    nonce_c = os.urandom(NONCE)
    return nonce_c, MAGIC + nonce_c + _mac(secret, b"client", nonce_s, nonce_c)


def verify_answer(secret: bytes, nonce_s: bytes, reply: bytes) -> bytes:
    """Server: check the client's reply; returns the proof to send back."""
    if not reply.startswith(MAGIC):
        raise AuthError("peer did not speak the aioccl handshake")
    nonce_c, mac = reply[len(MAGIC):len(MAGIC) + NONCE], reply[len(MAGIC) + NONCE:]
    if not hmac.compare_digest(mac, _mac(secret, b"client", nonce_s, nonce_c)):
        raise AuthError("peer does not know the communicator's secret")
    return _mac(secret, b"server", nonce_c, nonce_s)


def verify_proof(secret: bytes, nonce_s: bytes, nonce_c: bytes, proof: bytes) -> None:
    if proof == REFUSED:
        raise SecretRefused("the other side refused this process's secret: it was given a different one "
                            "(--secret / AIOCCL_COMM_SECRET, or the unique id) than this process")
    if not hmac.compare_digest(proof, _mac(secret, b"server", nonce_c, nonce_s)):
        raise AuthError("server does not know the communicator's secret")


async def as_server(sock: socket.socket, secret: bytes, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout):
        nonce_s, msg = challenge()
        await loop.sock_sendall(sock, msg)
        reply = await recv_bytes(sock, len(MAGIC) + NONCE + MAC)
        try:
            proof = verify_answer(secret, nonce_s, reply)
        except AuthError:
            if reply.startswith(MAGIC):  # an aioccl peer with another secret: tell it so, then drop it
                await loop.sock_sendall(sock, REFUSED)
            raise
        await loop.sock_sendall(sock, proof)


async def as_client(sock: socket.socket, secret: bytes, timeout: float, then: bytes = b"") -> None:
    """Answer the server's challenge, send ``then`` behind the answer, and check the server's proof."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout):
        msg = await recv_bytes(sock, len(MAGIC) + NONCE)
        nonce_c, reply = answer(secret, msg)
        await loop.sock_sendall(sock, reply + then)
        verify_proof(secret, msg[len(MAGIC):], nonce_c, await recv_bytes(sock, MAC))
