"""Ports reserved once and handed on: a launcher's (and a test's) ports cannot be taken before they are used.

"Find a free port, close it, pass the number on" races with every other
process on the machine: by the time a rank binds it, an outgoing connection
may hold it as its ephemeral port, or another job may have picked the same
one. A :class:`Reservation` instead keeps the port bound for as long as the
job runs, with ``SO_REUSEADDR`` and without listening. On Linux that keeps
the port out of every other ``bind(port 0)`` and every ephemeral choice of
``connect()``, and makes a plain ``bind`` to it fail; yet the process it was
meant for (aioccl's root, torch's ``TCPStore``: both set ``SO_REUSEADDR``)
binds and listens on it as if it were free. The launcher holds its
reservations until its ranks exit.

A port that cannot be reserved is an error that names it (``PortTaken``),
raised before any rank starts.
"""

from __future__ import annotations

import errno
import random
import socket

from ..errors import BootstrapError

TRIES = 64


class PortTaken(BootstrapError):
    """The port is in use by another process."""


class Reservation:
    """``n`` consecutive ports from ``port``, held bound (not listening) until :meth:`close`."""

    def __init__(self, sockets: list[socket.socket]) -> None:
        self._sockets = sockets
        self.port = int(sockets[0].getsockname()[1])
        self.ports = [int(s.getsockname()[1]) for s in sockets]

    def close(self) -> None:
        for s in self._sockets:
            s.close()
        self._sockets = []

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def bind_reusable(host: str, port: int) -> socket.socket:
    """A TCP socket bound with ``SO_REUSEADDR`` (what a reservation holds, and what may bind a reserved port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
    except BaseException:
        s.close()
        raise
    return s


def reserve(host: str = "", port: int = 0, count: int = 1, what: str = "a port") -> Reservation:
    """Reserve ``count`` consecutive ports on ``host``: from ``port``, or from one the kernel picks (0).

    ``what`` names the ports' use in the error (``"--master-port"``): a given port that is taken raises
    ``PortTaken`` naming it; with port 0 another block is tried.
    """
    for _ in range(TRIES if port == 0 else 1):
        held: list[socket.socket] = []
        try:
            held.append(bind_reusable(host, port))
            first = int(held[0].getsockname()[1])
            if first + count > 65536:
                raise OSError(errno.EADDRINUSE, "no room above it")
            for p in range(first + 1, first + count):
                held.append(bind_reusable(host, p))
            return Reservation(held)
        except OSError as e:
            for s in held:
                s.close()
            if port == 0 and e.errno == errno.EADDRINUSE:
                continue
            taken = f"{port}" if count == 1 else f"{port}-{port + count - 1}"
            raise PortTaken(f"{what}: port {taken} on {host or 'this host'} is taken ({e.strerror}): another "
                            f"process listens on it; choose another port") from None
    raise PortTaken(f"{what}: found no {count} free consecutive ports on {host or 'this host'} in {TRIES} tries")


def reserve_in(lo: int, hi: int, host: str = "", what: str = "a port") -> Reservation:
    """Reserve one port in ``[lo, hi)`` (a launcher whose port is derived from a job id must use that range)."""
    rng = random.Random()
    for _ in range(TRIES):
        try:
            return reserve(host, rng.randrange(lo, hi), what=what)
        except PortTaken:
            continue
    raise PortTaken(f"{what}: no free port in [{lo}, {hi}) on {host or 'this host'} in {TRIES} tries")
