"""The exception hierarchy.

Every failure a user can see is an :class:`AiocclError`, so one ``except``
clause catches them all; each subclass also derives from the builtin it is
closest to (``ValueError``, ``TimeoutError``) so generic code keeps working.
Failures carry data (op name, sequence number, ranks), not only text, because
a program that survives a bad day needs to know *which* peer went away.
"""

from __future__ import annotations


class AiocclError(Exception):
    """Base class of every aioccl error."""


class InvalidArgument(AiocclError, ValueError):
    """Bad input, raised before any byte is sent; the communicator stays usable."""


class BootstrapError(AiocclError):
    """The communicator could not be formed (rendezvous, handshake, addresses)."""


class CommAborted(AiocclError):
    """The communicator was aborted or closed; the op did not (fully) run."""


class PeerLost(AiocclError):
    """A peer's connection dropped (crash, abort or close) while an op needed it."""

    def __init__(self, rank: int, detail: str = "") -> None:
        self.rank = rank
        self.detail = detail
        msg = f"lost connection to rank {rank}"
        super().__init__(f"{msg}: {detail}" if detail else msg)


class CollectiveTimeout(AiocclError, TimeoutError):
    """An op passed its deadline; names the op, its sequence number and the silent ranks."""

    def __init__(self, op: str, seq: int, waiting_for: list[int], timeout: float, detail: str = "") -> None:
        self.op = op
        self.seq = seq
        self.waiting_for = list(waiting_for)
        self.timeout = timeout
        msg = f"{op} (seq {seq}) timed out after {timeout:g}s waiting for ranks {self.waiting_for}"
        super().__init__(f"{msg}; {detail}" if detail else msg)


class OpMismatch(AiocclError):
    """Two ranks disagree on an op (kind, dtype or size) at the same sequence number."""
