"""What the mailbox does with a peer's notice about a collective gone wrong (functions of the ``Mailbox``).

A MISMATCH notice (another rank issued a different call) and a FAIL notice
(a rank gave the op up, and why) both fail this rank's part of the op with the
root cause and are passed on once to the op's other ranks. A FAIL notice's
word (whom its reporter waited for) is also kept for ``blame.py``, and a rank
failed by a peer's timeout tells the others whom it was waiting for itself, so
their chains go on through it to the silent ranks. The state is the mailbox's, given to each function.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .. import log
from ..transport.frames import NOTICE, Header, unpack_failure
from .notices import Active, failure_error, own_wait, passed_on

if TYPE_CHECKING:
    from .mailbox import Mailbox

_log = log.get("COLL")


def on_notice(box: Mailbox, peer: int, h: Header, buf: np.ndarray) -> None:
    """The notice's reporter (``h.k - 1``; ``peer`` may only have passed it on) found that ``offender``
    issued another call at (ctx, seq): fail ours too."""
    reporter = h.k - 1 if h.k else peer
    try:
        if h.nbytes != NOTICE.size:
            return
        notice = bytes(buf.data[:NOTICE.size])
        offender, *theirs = NOTICE.unpack_from(notice)
    finally:
        box.pool.release(buf)
    op_key = (h.ctx, h.seq)
    if op_key in box.dead_ops or op_key in box.doomed_ops:
        return
    done = box.finished_ops.get(op_key)
    active = box.active.get(op_key) or done or Active(h.fingerprint(), (), 0)
    offender_fp = (theirs[0], theirs[1], theirs[2], theirs[3], theirs[4])
    exc = active.mismatch(h.ctx, h.seq, offender, offender_fp, reporter, h.fingerprint())
    if done is not None:
        _log.error("%s (reported by a peer after this rank's part had finished)", exc)
    box.fail_op(h.ctx, h.seq, exc)
    if box.forward is not None and active.ranks:
        box.forward(active.ranks, h.pack() + notice, peer)

def on_failure(box: Mailbox, reporter: int, h: Header, buf: np.ndarray) -> None:
    """``reporter`` gave up the collective (ctx, seq) and says why: fail ours with that root cause."""
    try:
        payload = bytes(buf.data[:h.nbytes])
        cause, culprits, seconds, message = unpack_failure(payload)
    except (ValueError, UnicodeError) as e:
        _log.warning("dropped a corrupt failure notice from rank %d: %s", reporter, e)
        return
    finally:
        box.pool.release(buf)
    op_key = (h.ctx, h.seq)
    box.reports.record(op_key, h.k - 1 if h.k else reporter, cause, culprits)  # for blame.py's chains
    if op_key in box.dead_ops or op_key in box.doomed_ops:
        return
    active = box.active.get(op_key) or box.finished_ops.get(op_key)
    ranks = active.ranks if active is not None else ()
    exc = failure_error(h, reporter, ranks, cause, culprits, seconds, message)
    if active is not None and ranks:  # whom this rank waits for itself: its receives still posted
        waits = [ranks.index(k[0]) for k in box.posted if k[1:3] == op_key and k[0] in ranks]
        exc = passed_on(exc, active.rank, [w for w in waits if ranks[w] != reporter])
        own = own_wait(h, active, cause, waits, seconds)
        if own is not None and box.forward is not None:
            box.forward(ranks, own, -1)
    if op_key in box.finished_ops:
        _log.warning("%s (after this rank's part of it had finished)", exc)
    box.fail_op(h.ctx, h.seq, exc)
    if box.forward is not None and ranks:
        box.forward(ranks, h.pack() + payload, reporter)
    for listener in box.failure_listeners:
        listener(h.ctx, h.seq, exc)
