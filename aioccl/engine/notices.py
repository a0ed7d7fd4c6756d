"""Failure notices, both ways: the frame a rank sends when it gives up a collective, and the error a
peer raises on receiving it. Pure functions (no sockets), so both sides are written side by side.
"""

from __future__ import annotations

from ..errors import AiocclError, CollectiveMismatch, CollectiveTimeout, PeerLost
from ..transport.frames import ABORTED, FAIL, LOST, TIMEOUT, Header, pack_failure

Fingerprint = tuple[int, int, int, int, int]  # op, dtype, redop, count, root (Header.fingerprint)
OP_NAMES = ("?", "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
            "gather", "scatter", "all_to_all", "barrier")


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
        cause, seconds, message = TIMEOUT, exc.timeout, f"rank {rank} timed out waiting for ranks {exc.waiting_for}"
    else:
        cause, culprits, seconds, message = ABORTED, [], 0.0, f"{type(exc).__name__}: {exc}"
    payload = pack_failure(cause, culprits, seconds, message)
    op, dtype, redop, count, root = fp
    return Header(FAIL, op, dtype, 0, ctx, seq, len(payload), count, root, redop).pack() + payload


def failure_error(h: Header, reporter: int, ranks: tuple[int, ...], cause: int, culprits: list[int],
                  seconds: float, message: str) -> AiocclError:
    """The error a rank raises for a FAIL frame from world rank ``reporter`` (``ranks``: the op's
    communicator, to name ranks as the user numbers them; empty when unknown here)."""
    name = OP_NAMES[h.op] if 0 < h.op < len(OP_NAMES) else f"op {h.op}"

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
