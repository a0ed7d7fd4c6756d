"""What ranks tell each other about a collective that went wrong, both ways, side by side.

A collective is known by its *fingerprint* (op, dtype, reduction, count,
root); two ranks whose fingerprints differ at one sequence number have
issued different calls (``Active.mismatch`` says which). A rank that gives
up a collective sends a FAIL frame (``failure_frame``); a peer turns it into
the error it raises (``failure_error``). Pure functions and records, no
sockets: the mailbox and the engine do the sending and receiving.
"""

from __future__ import annotations

from typing import TypeVar

from ..algorithms.table import TABLE, name_of
from ..dtypes import ReduceOp, dtype_from_code
from ..errors import AiocclError, CollectiveMismatch, CollectiveTimeout, PeerLost
from ..transport.frames import ABORTED, FAIL, LOST, TIMEOUT, Header, pack_failure

E = TypeVar("E", bound=BaseException)
Fingerprint = tuple[int, int, int, int, int]  # op, dtype, redop, count, root (Header.fingerprint)
ROOTED = {c.code for c in TABLE if c.rooted}


def describe(op: int, dtype: int, nbytes: int) -> str:
    """``all_reduce of 10 x float32 (40 bytes)``: a collective's frame or receive as a mismatch names it."""
    return f"{name_of(op, 'send') if op else 'send'} of {amount(dtype, nbytes)}"


def amount(dtype: int, nbytes: int) -> str:
    """``10 x float32 (40 bytes)``, or ``40 bytes`` for a dtype this rank does not know."""
    dt = dtype_from_code(dtype)
    if dt is None:
        return f"{nbytes} bytes"
    return f"{nbytes // max(1, dt.itemsize)} x {dt.name} ({nbytes} bytes)"


def describe_call(fp: Fingerprint) -> str:
    """``all_reduce(sum) of 10 x float32``: a collective call as its fingerprint tells it."""
    op, dtype, redop, count, root = fp
    dt = dtype_from_code(dtype)
    name = name_of(op)
    args = [o.value for o in ReduceOp if o.code == redop] + ([f"root {root}"] if op in ROOTED else [])
    return f"{name}({', '.join(args)}) of {count} x {dt.name if dt is not None else '-'}"


class Active:
    """A collective this rank is running: its call, and its communicator's ranks (to name peers)."""

    __slots__ = ("fp", "ranks", "rank")

    def __init__(self, fp: Fingerprint, ranks: tuple[int, ...], rank: int) -> None:
        self.fp, self.ranks, self.rank = fp, ranks, rank

    def mismatch(self, ctx: int, seq: int, a: int, a_fp: Fingerprint, b: int, b_fp: Fingerprint
                 ) -> CollectiveMismatch:
        """World rank ``a`` issued ``a_fp`` where world rank ``b`` issued ``b_fp``."""
        ra = self.ranks.index(a) if a in self.ranks else a
        rb = self.ranks.index(b) if b in self.ranks else b
        ca, cb = describe_call(a_fp), describe_call(b_fp)
        return CollectiveMismatch(
            f"collective mismatch at seq {seq} on comm {ctx:x}: rank {ra} issued {ca}, rank {rb} issued {cb}",
            seq, (ra, rb), (ca, cb))


def failure_frame(ctx: int, ranks: tuple[int, ...], rank: int, seq: int, fp: Fingerprint,
                  exc: BaseException) -> bytes | None:
    """The FAIL frame telling the other ranks of (ctx, seq) why this rank gave it up; None for errors
    that were themselves told to us, and for mismatches (which have their own notice)."""
    if not isinstance(exc, AiocclError) or exc.relayed or isinstance(exc, CollectiveMismatch):
        return None
    if isinstance(exc, PeerLost):
        cause, culprits, seconds, message = LOST, [exc.rank], 0.0, exc.detail
    elif isinstance(exc, CollectiveTimeout):
        culprits = [ranks[r] for r in exc.waiting_for if 0 <= r < len(ranks)]
        # its detail (the transport, algorithm and step) too: every rank's error then says where the op stood
        detail = f" ({exc.detail})" if exc.detail else ""  # (a relayed timeout is never passed on: its own)
        cause, seconds = TIMEOUT, exc.timeout
        message = f"rank {rank} timed out waiting for ranks {exc.waiting_for}{detail}"
    else:
        cause, culprits, seconds, message = ABORTED, [], 0.0, f"{type(exc).__name__}: {exc}"
    payload = pack_failure(cause, culprits, seconds, message)
    op, dtype, redop, count, root = fp
    # k: the reporting world rank + 1, kept when the frame is passed on (blame.py attributes it by this)
    return Header(FAIL, op, dtype, ranks[rank] + 1, ctx, seq, len(payload), count, root, redop).pack() + payload


def own_wait(h: Header, active: Active, cause: int, mine: list[int], seconds: float) -> bytes | None:
    """A rank failed by a peer's timeout notice tells the others whom it was waiting for itself (communicator
    ranks ``mine``), so that their chains (``blame.py``) go on through it to the silent ranks."""
    if cause != TIMEOUT or not mine:
        return None
    exc = CollectiveTimeout(name_of(h.op), h.seq, mine, seconds)
    return failure_frame(h.ctx, active.ranks, active.rank, h.seq, active.fp, exc)


def failure_error(h: Header, reporter: int, ranks: tuple[int, ...], cause: int, culprits: list[int],
                  seconds: float, message: str) -> AiocclError:
    """The error a rank raises for a FAIL frame from world rank ``reporter`` (``ranks``: the op's
    communicator, to name ranks as the user numbers them; empty when unknown here)."""
    name = name_of(h.op)

    def local(world: int) -> int:
        return ranks.index(world) if world in ranks else world

    by = f"reported by rank {local(reporter)}"
    exc: AiocclError
    if cause == LOST:
        exc = PeerLost(culprits[0] if culprits else reporter, f"{message} ({by}, seq {h.seq} on comm {h.ctx:x})")
    elif cause == ABORTED:
        exc = PeerLost(reporter, f"it gave up {name} seq {h.seq} on comm {h.ctx:x}: {message}")
    else:
        exc = CollectiveTimeout(name, h.seq, [local(c) for c in culprits], seconds, f"{by}: {message}", f"{h.ctx:x}")
    exc.relayed = True  # told to us: not to be told on again
    return exc


def passed_on(exc: E, me: int, mine: list[int]) -> E | CollectiveTimeout:
    """A peer's timeout report may name this rank (``me``) as the silent one while it is itself waiting
    for ranks ``mine`` (communicator ranks): then those are the silent ones, and the error this rank
    raises names them, so that each rank's error points at the root cause, not at a rank in between."""
    silent = sorted(set(mine) - {me})
    if not isinstance(exc, CollectiveTimeout) or me not in exc.waiting_for or not silent:
        return exc
    out = CollectiveTimeout(exc.op, exc.seq, silent, exc.timeout, f"{exc.detail}, which waits for ranks {silent}",
                            exc.comm)
    out.relayed = True
    return out
