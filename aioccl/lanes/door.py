"""The one door every op goes through: the lanes tried in one order, each answering with a typed answer.

Every public collective is one line: ``door.collective(code, x, out, op, root, timeout, stream)``; every
message ``door.message(SEND or RECV, ...)``. The door offers the call to the lanes in ``ORDER`` and returns the first
``Work`` one gives. A lane answers ``Work`` (it took the call), ``Declined`` (and why) or ``Handover`` (an
op its native entry started and could not finish in the call: the same lane has the engine carry it on).

The first lane of each order has a native entry the door tries on the caller's own arguments, before any
record is made: that is the hot path (a repeated small op done in C, from the call to the done Work), and it
costs one C call. Only when it declines is the ``Call`` record made, its buffers classified once, and the
lanes asked in order, the first again with the record (it may take what it can view: a CPU tensor).

Why a call took the road it took: ``AIOCCL_DEBUG=INFO AIOCCL_DEBUG_SUBSYS=LANES`` logs, once per call form,
which lane took it and why each earlier lane declined (the door looks the log's level up on the first call
through the record and every 64th after: each look-up costs more than the door itself); ``comm.explain(...)``
(``explain`` here) answers the same for one call without running it. docs/architecture.md's table of lanes is
checked against each lane's ``RULES`` (tests/test_lanes.py).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from .. import log
from ..native.answers import REASONS, Declined, Handover
from ..work import Work
from .call import RECV, SEND, Call

# The order the lanes are tried in, by name: for collectives and for messages. The one place it is said.
ORDER: dict[str, tuple[str, ...]] = {
    "collective": ("cpu", "gpu", "general"),
    "message": ("pair", "general"),
}

GENERAL = "general"  # the last lane of each order
LOG_LOOKED_UP_EVERY = 64  # calls through the record between two look-ups of whether the LANES log is on
_log = log.get("LANES")
_LOGGED_MAX = 1024  # call forms logged at most (then the log says it stops: nothing grows without bound)


class Lane(Protocol):
    """What the door asks of a lane (aioccl/lanes/*.py)."""

    name: str
    RULES: tuple[tuple[str, str], ...]  # (reason, when it declines for it): the docs' table, the tests' rows
    on: bool  # False: it takes nothing now (no native part, or switched off); the door passes it by as "off"

    def check(self, call: Call) -> Declined | None:
        """Why this lane would decline ``call`` without trying it, or None (it would try it)."""

    def try_call(self, call: Call) -> Work[Any] | Declined | Handover:
        """Take ``call``, which ``check`` let through: its Work, a Declined, or a Handover (an op started that
        the engine must carry on)."""

    def carry_on(self, handed: Handover, call: Call) -> Work[Any]:
        """The engine carries on with an op this lane's native entry started (only a lane with one)."""


def switch_off(lane: Any) -> None:
    """Switch a native lane off: the door passes it by (``on``), and its native part declines too (for callers
    that hold only the native lane: an XLA custom call, on XLA's thread). The communicator's state calls it as
    it closes, shrinks or loses a rank."""
    lane.on = False
    if lane.native is not None:
        lane.native.enabled = False


class Door:
    """A communicator's door: its lanes by name, tried in ``ORDER``.

    ``first``: the first collective lane's native entry on raw arguments, ``(code, x, out, op, root) ->
    Work | Declined | Handover`` (the CPU lane's ``Lane.call``, or a stand-in that declines while it has
    none); ``first_send`` / ``first_recv`` likewise for messages (the pair lane's)."""

    def __init__(self, lanes: dict[str, Lane]) -> None:
        self.lanes = lanes
        self.collective_lanes = tuple(lanes[name] for name in ORDER["collective"])
        self.message_lanes = tuple(lanes[name] for name in ORDER["message"])
        self._asked = (self.collective_lanes[:-1], self.message_lanes[:-1])  # the lanes before the general way
        general = lanes[GENERAL]
        assert ORDER["collective"][-1] == ORDER["message"][-1] == GENERAL, "the general way comes last"
        # (the last lane's own entries: it takes every call)
        self._general = (general.collective, general.message)  # type: ignore[attr-defined]
        self._logged: set[tuple[Any, ...]] = set()
        self._telling = False  # whether the LANES log is on, as last looked up
        self._ask_log_in = 0  # calls through the record before it is looked up again

    def collective(self, code: int, x: Any, out: Any, op: Any, root: Any, timeout: float | None,
                   stream: Any) -> Work[Any]:
        if timeout is None and stream is None:  # the hot path: the first lane's C entry, no record made
            got = self.collective_lanes[0].first(code, x, out, op, root)  # type: ignore[attr-defined]
            if got.__class__ is Work:
                return got
            if got.__class__ is Handover:
                return self.collective_lanes[0].carry_on(got, Call(code, x, out, op, root, None, None))
            return self._issue(Call(code, x, out, op, root, None, None, got), 0)
        return self._issue(Call(code, x, out, op, root, timeout, stream), 0)

    def message(self, code: int, x: Any, peer: Any, tag: Any, timeout: float | None, stream: Any) -> Work[Any]:
        """``isend`` (``code`` SEND, ``x`` the array sent) or ``irecv`` (RECV, ``x`` the array received into)."""
        if timeout is None and stream is None:
            first = self.message_lanes[0]
            got = (first.first_send if code == SEND else first.first_recv)(x, peer, tag)  # type: ignore[attr-defined]
            if got.__class__ is Work:
                return got
            return self._issue(Call(code, x, None, None, peer, None, None, got, tag), 1)
        return self._issue(Call(code, x, None, None, peer, timeout, stream, None, tag), 1)

    def _issue(self, call: Call, kind: int) -> Work[Any]:
        """The record's way: each lane in order until one gives a Work; the last, the general way, takes every
        call (or raises ``InvalidArgument``), so it is not asked to check it. ``kind``: 0 a collective, 1 a
        message. Why each lane declined is kept only while the LANES log is on."""
        self._ask_log_in -= 1
        if self._ask_log_in <= 0:  # (asking logging each time would cost more than the door itself)
            self._ask_log_in = LOG_LOOKED_UP_EVERY
            self._telling = _log.isEnabledFor(logging.INFO)
        declined: list[tuple[str, str]] | None = [] if self._telling else None
        for lane in self._asked[kind]:
            if not lane.on:
                if declined is not None:
                    declined.append((lane.name, "off"))
                continue
            got = lane.check(call) or lane.try_call(call)
            if got.__class__ is Declined:
                if declined is not None:
                    declined.append((lane.name, got.reason))
                continue
            if got.__class__ is Handover:
                got = lane.carry_on(got, call)
            if declined is not None:
                self._tell(call, lane.name, declined)
            return got  # type: ignore[return-value]
        if declined is not None:
            self._tell(call, GENERAL, declined)
        return self._general[kind](call)  # type: ignore[no-any-return]

    def _tell(self, call: Call, took: str, declined: list[tuple[str, str]]) -> None:
        """The LANES log: once per call form, who took it and why the lanes before it declined."""
        key = (call.describe(), took, tuple(declined))
        if key in self._logged or len(self._logged) > _LOGGED_MAX:
            return
        self._logged.add(key)
        if len(self._logged) > _LOGGED_MAX:
            _log.info("more than %d call forms logged: no more are", _LOGGED_MAX)
            return
        why = "; ".join(f"{name} declined: {reason} ({REASONS[reason]})" for name, reason in declined)
        _log.info("%s: the %s lane took it%s", key[0], took, f" ({why})" if why else "")

    def explain(self, call: Call) -> list[tuple[str, str]]:
        """What each lane would do with ``call``, in order, without running it: ``(lane, "declines: <reason>
        (<what it means>)")`` for each lane before the one that would try it, then ``(lane, "would try it")``
        (a native lane, which may still decline when it runs: a form not learnt yet, the channel busy) or
        ``("general", "would take it")``."""
        lanes = self.message_lanes if call.code in (SEND, RECV) else self.collective_lanes
        out: list[tuple[str, str]] = []
        for lane in lanes:
            no = lane.check(call)
            if no is None:  # (a native lane may still decline when it runs: a form not learnt, the channel busy)
                out.append((lane.name, "would take it" if lane.name == "general" else "would try it"))
                return out
            out.append((lane.name, f"declines: {no.reason} ({REASONS[no.reason]})"))
        return out
