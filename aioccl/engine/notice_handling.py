"""What the mailbox does with a peer's notice about a collective gone wrong: a mixin of ``Mailbox``.

A MISMATCH notice (another rank issued a different call) and a FAIL notice
(a rank gave the op up, and why) both fail this rank's part of the op with the
root cause and are passed on once to the op's other ranks. A FAIL notice's
word (whom its reporter waited for) is also kept for ``blame.py``, and a rank
failed by a peer's timeout tells the others whom it was waiting for itself, so
their chains go on through it to the silent ranks. The state is the mailbox's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from .. import log
from ..errors import AiocclError
from ..transport.frames import NOTICE, Header, unpack_failure
from .notices import Active, failure_error, own_wait, passed_on

if TYPE_CHECKING:
    from .blame import Reports
    from .pool import BufferPool
    from .receives import Posted

_log = log.get("COLL")


class NoticeHandling:
    pool: BufferPool
    reports: Reports
    posted: dict[tuple[int, int, int, int], Posted]
    active: dict[tuple[int, int], Active]
    _dead: set[tuple[int, int]]
    _doomed: dict[tuple[int, int], AiocclError]
    _finished: dict[tuple[int, int], Active]
    forward: Callable[[tuple[int, ...], bytes, int], None] | None
    failure_listeners: list[Callable[[int, int, AiocclError], None]]
    fail_op: Callable[[int, int, AiocclError], None]  # the mailbox's: fail (ctx, seq) here with the error

    def _on_notice(self, peer: int, h: Header, buf: np.ndarray) -> None:
        """The notice's reporter (``h.k - 1``; ``peer`` may only have passed it on) found that ``offender``
        issued another call at (ctx, seq): fail ours too."""
        reporter = h.k - 1 if h.k else peer
        try:
            if h.nbytes != NOTICE.size:
                return
            notice = bytes(buf.data[:NOTICE.size])
            offender, *theirs = NOTICE.unpack_from(notice)
        finally:
            self.pool.release(buf)
        op_key = (h.ctx, h.seq)
        if op_key in self._dead or op_key in self._doomed:
            return
        done = self._finished.get(op_key)
        active = self.active.get(op_key) or done or Active(h.fingerprint(), (), 0)
        offender_fp = (theirs[0], theirs[1], theirs[2], theirs[3], theirs[4])
        exc = active.mismatch(h.ctx, h.seq, offender, offender_fp, reporter, h.fingerprint())
        if done is not None:
            _log.error("%s (reported by a peer after this rank's part had finished)", exc)
        self.fail_op(h.ctx, h.seq, exc)
        if self.forward is not None and active.ranks:
            self.forward(active.ranks, h.pack() + notice, peer)

    def _on_failure(self, reporter: int, h: Header, buf: np.ndarray) -> None:
        """``reporter`` gave up the collective (ctx, seq) and says why: fail ours with that root cause."""
        try:
            payload = bytes(buf.data[:h.nbytes])
            cause, culprits, seconds, message = unpack_failure(payload)
        except (ValueError, UnicodeError) as e:
            _log.warning("dropped a corrupt failure notice from rank %d: %s", reporter, e)
            return
        finally:
            self.pool.release(buf)
        op_key = (h.ctx, h.seq)
        self.reports.record(op_key, h.k - 1 if h.k else reporter, cause, culprits)  # for blame.py's chains
        if op_key in self._dead or op_key in self._doomed:
            return
        active = self.active.get(op_key) or self._finished.get(op_key)
        ranks = active.ranks if active is not None else ()
        exc = failure_error(h, reporter, ranks, cause, culprits, seconds, message)
        if active is not None and ranks:  # whom this rank waits for itself: its receives still posted
            waits = [ranks.index(k[0]) for k in self.posted if k[1:3] == op_key and k[0] in ranks]
            exc = passed_on(exc, active.rank, [w for w in waits if ranks[w] != reporter])
            own = own_wait(h, active, cause, waits, seconds)
            if own is not None and self.forward is not None:
                self.forward(ranks, own, -1)
        if op_key in self._finished:
            _log.warning("%s (after this rank's part of it had finished)", exc)
        self.fail_op(h.ctx, h.seq, exc)
        if self.forward is not None and ranks:
            self.forward(ranks, h.pack() + payload, reporter)
        for listener in self.failure_listeners:
            listener(h.ctx, h.seq, exc)
