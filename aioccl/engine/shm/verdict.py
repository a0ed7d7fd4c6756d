"""One outcome for every rank of a shared-memory op that a rank gives up at its deadline.

On a channel a rank that arrives late can find every step it needs already published (a flat
all_reduce: the others' inputs sit in their slots) and finish the op in the call, though the others
gave up on it a moment or a second before: it would return a result they raised ``CollectiveTimeout``
for. The failure notice they send comes over the pair's ring, which the late rank has not read yet.

So the outcome of an op someone gives up is decided once, under a lock (``flock`` on the channel's
rank 0 segment: the kernel drops it with a dead holder), and written into that segment's control page:
``OK`` (every step was there after all) or ``TIMEOUT`` (who gave up, waiting for whom, after how long).
Each rank then abides by it:

* a rank at its deadline marks its intent (``GAVE_UP``: the op's channel order + 1), fences, takes the
  lock, and looks again at the step it waits for: there now, it writes ``OK`` (unless a verdict stands)
  and goes on waiting; else it writes ``TIMEOUT`` and raises it;
* a rank that finishes an op fences and looks at every rank's intent: none for this op or a later one
  (the fast path, one load per rank), it succeeds; else it takes the lock and abides by the verdict, or
  writes ``OK``. The last ``VERDICTS`` verdicts are kept, so a rank that comes to an op after the others
  gave up a later one too still finds its own.

Why the fast path is safe (x86 TSO, stores seen by all cores at once): a finishing rank saw every step
it waited for, then found no intent; a rank that sets its intent later (after the fence) and looks at
the steps again sees them too, so it decides ``OK``. A rank whose part finishes without the step the
other waits for (a broadcast's root) may succeed while the others time out: its part is done, as with
a mismatch (docs/api.md).
"""

from __future__ import annotations

import fcntl
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ...errors import CollectiveTimeout
from ...transport.shm.fifo import fence
from ...transport.shm.segment import GAVE_UP, VERDICT_AT, VERDICT_LEN, VERDICTS

if TYPE_CHECKING:
    from ..op import Op

OK, TIMEOUT = 1, 2


def timeout_maker(op: Op[Any], step: int | None = None) -> Callable[[list[int], float, int], CollectiveTimeout]:
    """``make(missing, timeout, by)`` for an op of a channel: this rank's timeout (``by`` -1), or the one
    rank ``by`` gave the op up with (its verdict)."""
    where = f"shared memory, algorithm {op.sched.algo}" + (f", step {step}" if step is not None else "")

    def make(missing: list[int], timeout: float, by: int) -> CollectiveTimeout:
        if by < 0:
            return CollectiveTimeout(op.name, op.seq, missing, timeout, where)
        told = f"reported by rank {by}: rank {by} timed out waiting for ranks {missing} ({where})"
        return CollectiveTimeout(op.name, op.seq, missing, timeout, told)

    return make


class Verdicts:
    """The channel's decisions on given-up ops; ``ctl``: every rank's control words (mine at ``rank``)."""

    def __init__(self, ctl: Sequence[memoryview], rank: int, lock_fd: int) -> None:
        self.ctl, self.rank, self.lock_fd = ctl, rank, lock_fd

    def give_up(self, order: int, reached: Callable[[], bool], missing: list[int], timeout: float,
                make: Callable[[list[int], float, int], CollectiveTimeout]) -> CollectiveTimeout | None:
        """This rank's deadline passed waiting for ``missing``: the timeout to raise, or None when the op
        goes on (its step came meanwhile, or a rank found it complete)."""
        self.ctl[self.rank][GAVE_UP] = order + 1
        fence()
        with _Locked(self.lock_fd):
            word = self._read(order)
            if word is None:
                if reached():
                    self._write(order, OK)
                    return None
                self._write(order, TIMEOUT, missing, timeout)
                return make(missing, timeout, -1)
        return self._abide(order, word, make)

    def finished(self, order: int, make: Callable[[list[int], float, int], CollectiveTimeout]
                 ) -> CollectiveTimeout | None:
        """This rank completed op ``order``: the timeout it must raise instead, if another rank gave it up.
        No fence of its own: the op's last ``publish`` fenced after this rank's last step, and only loads
        came since (a store then a load is the one order x86 may swap)."""
        if self.clean(order):
            return None
        with _Locked(self.lock_fd):
            word = self._read(order)
            if word is None:
                self._write(order, OK)
                return None
        return self._abide(order, word, make)

    def clean(self, order: int) -> bool:
        """No rank gave up op ``order`` or a later one: a finished op stands (the fast path, inlined)."""
        for c in self.ctl:  # noqa: SIM110 - a plain loop: all() over a generator costs more on every op
            if c[GAVE_UP] > order:
                return False
        return True

    def timed_out(self, order: int) -> bool:
        """Whether op ``order`` was given up for good (every rank of it raises its timeout)."""
        word = self._read(order)
        return word is not None and word & 3 == TIMEOUT

    def _entry(self, order: int) -> int:
        return VERDICT_AT + (order % VERDICTS) * VERDICT_LEN

    def _read(self, order: int) -> int | None:
        word = self.ctl[0][self._entry(order)]
        return word if word >> 2 == order + 1 else None

    def _write(self, order: int, kind: int, missing: Sequence[int] = (), timeout: float = 0.0) -> None:
        c, at = self.ctl[0], self._entry(order)
        c[at + 1] = self.rank
        c[at + 2] = sum(1 << j for j in missing if j < 63)
        c[at + 3] = int(timeout * 1000)
        c[at] = (order + 1) * 4 + kind  # last: whoever sees the verdict sees its details

    def _abide(self, order: int, word: int, make: Callable[[list[int], float, int], CollectiveTimeout]
               ) -> CollectiveTimeout | None:
        if word & 3 == OK:
            return None
        c, at = self.ctl[0], self._entry(order)
        by, mask = int(c[at + 1]), int(c[at + 2])
        missing = [j for j in range(min(63, len(self.ctl))) if mask >> j & 1]
        return make(missing, c[at + 3] / 1000, by)


class _Locked:
    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *_: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
