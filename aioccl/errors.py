"""The exception hierarchy.

Every failure a user can see is an [`AiocclError`][aioccl.errors.AiocclError], so one ``except``
clause catches them all; each subclass also derives from the builtin it is
closest to (``ValueError``, ``TimeoutError``) so generic code keeps working.
Failures carry data (op name, sequence number, ranks), not only text, because
a program that survives a bad day needs to know *which* peer went away.
"""

from __future__ import annotations


class AiocclError(Exception):
    """Base class of every aioccl error."""

    #: True when a peer reported this failure (a failure notice) rather than this rank seeing it first
    relayed: bool = False


class InvalidArgument(AiocclError, ValueError):
    """Bad input, raised before any byte is sent; the communicator stays usable."""


class BootstrapError(AiocclError):
    """The communicator could not be formed (meeting at the root, handshake, addresses)."""


class CommAborted(AiocclError):
    """The communicator was aborted or closed; the op did not (fully) run."""


class OpCancelled(AiocclError):
    """The op was withdrawn before any peer saw it: by ``work.cancel()``, by cancelling the task that
    awaited it, or by ``close()`` while it was an unmatched receive.

    Not ``asyncio.CancelledError``: a task that awaits a Work someone else withdrew was not itself
    cancelled, and a task group must not mistake it for its own cancellation and end quietly.
    ``op`` and ``seq`` (a point-to-point op's tag) name the op.
    """

    def __init__(self, op: str, seq: int, why: str) -> None:
        self.op = op
        self.seq = seq
        super().__init__(f"{op} (seq {seq}) was withdrawn {why}; no message was taken into its buffer")


class PeerLost(AiocclError):
    """A peer's connection dropped (crash, abort or close) while an op needed it."""

    def __init__(self, rank: int, detail: str = "") -> None:
        self.rank = rank
        self.detail = detail
        msg = f"lost connection to rank {rank}"
        super().__init__(f"{msg}: {detail}" if detail else msg)


class CollectiveTimeout(AiocclError, TimeoutError):
    """An op passed its deadline; names the op, its sequence number, the communicator and the silent ranks.

    ``recent`` holds the communicator's flight recorder at the time (its last
    ops, oldest first), which the message shows too: the op that never
    matched is often a few calls back on some rank.
    """

    def __init__(self, op: str, seq: int, waiting_for: list[int], timeout: float, detail: str = "",
                 comm: str = "") -> None:
        self.op = op
        self.seq = seq
        self.waiting_for = list(waiting_for)
        self.timeout = timeout
        self.detail = detail
        self.comm = comm
        self.recent: list[str] = []
        super().__init__(self._headline())

    def _headline(self) -> str:
        where = f"seq {self.seq}, comm {self.comm}" if self.comm else f"seq {self.seq}"
        msg = f"{self.op} ({where}) timed out after {self.timeout:g}s waiting for ranks {self.waiting_for}"
        return f"{msg}; {self.detail}" if self.detail else msg

    def __str__(self) -> str:
        if not self.recent:
            return self._headline()
        return self._headline() + "\nrecent ops on this rank (oldest first):\n  " + "\n  ".join(self.recent)


class CollectiveMismatch(AiocclError):
    """Ranks issued different collectives at the same sequence number.

    Raised on every rank of the op, naming both ranks and both calls (op,
    dtype, count, root); the sequence number is consumed everywhere, so the
    communicator stays usable for the next op.
    """

    def __init__(self, message: str, seq: int = -1, ranks: tuple[int, ...] = (),
                 calls: tuple[str, ...] = ()) -> None:
        self.seq = seq
        self.ranks = ranks
        self.calls = calls
        super().__init__(message)


OpMismatch = CollectiveMismatch  # the name before issue 5; kept for existing code
