"""A hostile client on loopback: hammers a bootstrap root and a rank's data port for a bounded time.

    python fuzzer.py HOST ROOT_PORT DATA_PORT SECRET_HEX SECONDS SEED

Modes: random bytes, a truncated or wrong-secret handshake, a replayed
handshake, an oversized or truncated hello after a good handshake, slow
senders, silent holders, and a flood of connections. Every connection is
bounded in time; errors on our side (refused, reset) are expected and
counted. Prints one line per connection (mode and local port) and a summary.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import random
import socket
import struct
import sys
import threading
import time

MAGIC = b"AIOCCL\x01\x00"


def client_reply(secret: bytes, challenge: bytes) -> bytes:
    nonce_s, nonce_c = challenge[len(MAGIC):], os.urandom(16)
    return MAGIC + nonce_c + hmac.new(secret, b"client" + nonce_s + nonce_c, hashlib.sha256).digest()


def recv_n(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def attack(mode: str, host: str, port: int, secret: bytes, rng: random.Random, replay: list[bytes]) -> None:
    with socket.create_connection((host, port), timeout=3) as s:
        print(f"{mode} port={port} local={s.getsockname()[1]}", flush=True)
        if mode == "random":
            s.sendall(rng.randbytes(rng.randint(0, 300)))
            return
        if mode == "hold":
            time.sleep(rng.uniform(0.5, 2.0))
            return
        if mode == "slow":
            for b in MAGIC + os.urandom(40):
                s.sendall(bytes([b]))
                time.sleep(0.2)
            return
        challenge = recv_n(s, len(MAGIC) + 16)
        if mode == "truncated":
            s.sendall(client_reply(secret, challenge)[: rng.randint(0, 55)])
        elif mode == "wrong-secret":
            s.sendall(client_reply(os.urandom(16), challenge))
        elif mode == "replay":
            if not replay:
                return
            s.sendall(replay[0])
        elif mode in ("oversized", "truncated-hello", "bad-hello"):
            reply = client_reply(secret, challenge)
            replay[:] = [reply]  # what an eavesdropper would have recorded
            s.sendall(reply)
            recv_n(s, 32)  # the server's proof
            if mode == "oversized":
                s.sendall(struct.pack("<I", 0xFFFFFFF0) + b"{" * 100)
            elif mode == "truncated-hello":
                s.sendall(struct.pack("<I", 1000) + b'{"rank": ')
            else:
                body = b'{"rank": "x", "world_size": [], "comm_id": null}'
                s.sendall(struct.pack("<I", len(body)) + body)
        s.settimeout(0.3)  # see whether the server hangs up; do not wait on servers that wait for more
        try:
            s.recv(100)
        except OSError:
            pass


def main() -> None:
    host, root_port, data_port, secret_hex, seconds, seed = sys.argv[1:7]
    secret, rng = bytes.fromhex(secret_hex), random.Random(int(seed))
    ports = [int(root_port), int(data_port)]
    modes = ["random", "truncated", "wrong-secret", "replay", "oversized", "truncated-hello", "bad-hello"]
    end = time.monotonic() + float(seconds)
    counts = {"sent": 0, "refused": 0}
    replay: list[bytes] = []
    threads = []
    for i in range(6):  # slow senders and silent holders alongside the rest
        mode = "slow" if i % 2 else "hold"
        t = threading.Thread(target=_safe, args=(attack, mode, host, ports[i % 2], secret, random.Random(i),
                                                 replay, counts))
        t.start()
        threads.append(t)
    n = 0
    while time.monotonic() < end and n < 400:  # bounded
        n += 1
        _safe(attack, rng.choice(modes), host, rng.choice(ports), secret, rng, replay, counts)
    for t in threads:
        t.join(10)
    print(f"FUZZ DONE connections={counts['sent']} refused={counts['refused']}", flush=True)


def _safe(fn, mode, host, port, secret, rng, replay, counts) -> None:
    try:
        fn(mode, host, port, secret, rng, replay)
        counts["sent"] += 1
    except OSError:
        counts["refused"] += 1  # the port is closed once bootstrap is over; resets are expected


if __name__ == "__main__":
    main()
