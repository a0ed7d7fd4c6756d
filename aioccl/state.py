"""What a communicator is now, in one object its parts share: open or not, a rank lost, its ops in flight.

A communicator is a facade over parts (the door and its lanes, the planner, the tracker, the launcher, its
lifecycle), and every part needs to know the same few facts: may an op start (closed? aborted? a member
lost?), which ops are in flight, where finished ops are recorded, its channel and its counters. They are
here, written only through this object's methods, so a fact changes in one place: ``close_with`` and
``lose_member`` switch the lanes off in the same step that makes the communicator refuse ops, for callers
that read only a lane (an XLA custom call, on XLA's thread, without the GIL).

The engine's watchdog and ``recovery.on_member_lost`` act on communicators through their state: they never
hold a ``Communicator``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .engine.shm import native as shm_native
from .envvars import check_timeout
from .errors import CommAborted, PeerLost
from .introspection import FlightRecorder
from .work import Work

if TYPE_CHECKING:
    from .engine.shm.channel import ShmChannel
    from .engine.view import CommView


class CommState:
    """The shared facts of one communicator. ``view``: its ranks and context; ``timeout``: the default
    deadline of its ops; ``parent``: its parent's state (a ``split`` child refuses ops once the parent is
    closed), or None."""

    def __init__(self, view: CommView, timeout: float, parent: CommState | None = None) -> None:
        self.view = view
        self.timeout = timeout
        self.parent = parent
        self.lock = threading.Lock()
        self.closed: BaseException | None = None
        self.member_lost: PeerLost | None = None  # a rank of it was lost (not closed): ops fail until shrink
        self.aborted = False
        self.inflight: set[Work[Any]] = set()
        self.recorder = FlightRecorder()
        self.shm: ShmChannel | None = None  # its shared-memory channel, when its ranks share one host
        self.counters: Any = shm_native.Counters()  # sequence numbers and channel orders; the CPU lane's once made
        self.native_max = shm_native.max_bytes()  # the largest op the native core runs on its channel
        self._offs: list[Callable[[], None]] = []  # the lanes' off switches

    @property
    def rank(self) -> int:
        return self.view.rank

    @property
    def seq(self) -> int:
        """The sequence number the next op takes (how many this communicator has issued)."""
        return int(self.counters.seq)

    def usable(self) -> None:
        """Raise why no op may start (closed, aborted, shrunk; the parent closed); nothing when one may."""
        if self.closed is not None:
            raise self.closed
        if self.parent is not None and self.parent.closed is not None:
            raise CommAborted(f"parent communicator is closed: {self.parent.closed}")

    def op_timeout(self, timeout: float | None) -> float:
        """An op's deadline: the call's own (checked: a bad one raises before anything is sent), or the
        communicator's."""
        return self.timeout if timeout is None else check_timeout(timeout)

    def on_off(self, off: Callable[[], None]) -> None:
        """``off()`` is called when the communicator takes no more ops (a lane's switch)."""
        self._offs.append(off)
        if self.closed is not None or self.member_lost is not None:
            off()

    def lanes_off(self) -> None:
        for off in self._offs:
            off()

    def close_with(self, exc: BaseException, *, abort: bool = False) -> bool:
        """Refuse every later op with ``exc`` and switch the lanes off; False when it was closed already
        (for ``abort``: aborted already)."""
        with self.lock:
            if (self.aborted if abort else self.closed is not None):
                return False
            self.closed = exc
            self.aborted = self.aborted or abort
        self.lanes_off()
        return True

    def lose_member(self, exc: PeerLost) -> bool:
        """A rank of it was lost: every op in flight that no peer has seen, and every later op, fails with
        ``exc`` until the app shrinks it. False when it was closed or had lost a rank already."""
        if self.closed is not None or self.member_lost is not None:
            return False
        self.member_lost = exc
        self.lanes_off()
        for w in list(self.inflight):
            w._withdraw_with(exc)
        return True
