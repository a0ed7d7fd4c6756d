"""The issue order of a shared-memory channel's ops, and who runs the next one.

A part of each ``ShmChannel`` (``IssueOrder``), given the channel's native half (or None), its held ops and
its queue. Ops on a channel run one at a time, in the order their numbers were taken (``Op.order``, with the
sequence number). With the native core the numbers and the turn live in its *gate*
(``aioccl/native/src/core/gate.h``), because a native caller outside the engine, an XLA custom call of jax_ext
on XLA's own thread, runs ops of the channel too, without the GIL: it claims the channel only when every op
issued so far has finished and the engine holds none, and the engine admits an op only when its number is
next and no native caller holds the channel. An op the engine had to hold meanwhile is admitted when the
caller is done: the caller rings this rank's doorbell (``on_bell``). Without the core, the same rule on a
Python counter.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from ..op import Op


class IssueOrder:
    """The turn of one channel's ops: ``native`` (the channel's native half, whose gate keeps the turn) or None
    (a Python counter); ``held``: ops submitted ahead of their turn, by number; ``queue``: ops admitted."""

    def __init__(self, native: Any, held: dict[int, Op[np.ndarray]], queue: deque[Op[np.ndarray]]) -> None:
        self.native = native
        self.held = held
        self.queue = queue
        self._next_order = 0  # the issue number (Op.order) of the op that runs next, without the core

    @property
    def next_order(self) -> int:
        """The issue number of the op the channel runs next (with the native core: its gate's, which a
        native caller outside the engine, an XLA custom call, advances too)."""
        return int(self.native.next_order) if self.native is not None else self._next_order

    @next_order.setter
    def next_order(self, value: int) -> None:
        if self.native is not None:
            self.native.next_order = value
        else:
            self._next_order = value

    def admit(self, order: int) -> bool:
        """May op ``order`` run now (it is next, and no native caller holds the channel)? Then it counts as
        the engine's until ``finished``."""
        if self.native is not None:
            return bool(self.native.admit(order))
        if order != self._next_order:
            return False
        self._next_order += 1
        return True

    def finished(self) -> None:
        if self.native is not None:
            self.native.finish()

    def admit_held(self) -> None:
        """Queue the held ops whose turn has come (in order)."""
        while self.held:
            first = min(self.held)
            if not self.admit(first):
                return
            self.queue.append(self.held.pop(first))
