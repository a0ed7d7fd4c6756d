"""The general way: the last lane, which takes every call the others declined.

It checks the call's arguments in full (raising ``InvalidArgument`` before anything is sent), views the
buffers (``buffers.adapt``), plans the schedule and hands the op to the engine: the shared-memory channel,
the pairs' messages, or the GPU path (``Communicator._collective``). Its functions are the communicator's
own (``collectives.py``'s and ``p2p.py``'s argument handling), given to it: the door never declines a call.
Any timeout, any stream, any buffer the library takes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..native.answers import Declined, Handover
from ..work import Work
from .call import RECV, SEND, Call


class General:
    """``collective(call)`` and ``message(call)``: the communicator's general way for each kind of call."""

    name = "general"
    on = True
    RULES: tuple[tuple[str, str], ...] = ()  # it declines nothing

    def __init__(self, collective: Callable[[Call], Work[Any]], message: Callable[[Call], Work[Any]]) -> None:
        self.collective = collective  # (the door calls these two itself: the general way takes every call)
        self.message = message

    def check(self, call: Call) -> Declined | None:
        return None

    def run(self, call: Call) -> Work[Any]:
        return self.message(call) if call.code in (SEND, RECV) else self.collective(call)

    try_call = run

    def carry_on(self, handed: Handover, call: Call) -> Work[Any]:
        raise AssertionError("the general way hands nothing over")
