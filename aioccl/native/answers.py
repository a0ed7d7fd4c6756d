"""What a lane answers when it does not finish a call: ``Declined`` (and why) or ``Handover`` (an op it started).

A lane (aioccl/lanes/) answers every call it is offered with one of three things: the done ``Work``, a
``Declined`` that names its reason, or a ``Handover``: the op it started in the call and could not finish
there (a late peer, a failure), which the engine carries on. The native lanes (C) answer with these same
classes: the module is given them once when it is loaded (``answers_setup``) and makes the ``Declined`` of
each of its reasons then, so declining allocates nothing. The lanes with no C side make their own.

Nothing here imports the rest of aioccl: the native layer sits below the engine.
"""

from __future__ import annotations

from typing import Any

# every reason a lane gives, and what it means to a user asking "why did my call take the slow road?"
REASONS: dict[str, str] = {
    "off": "the lane is switched off: no native core (AIOCCL_NATIVE=0, or it did not load), no shared-memory "
           "channel or pair here, or the communicator is closed, aborted, shrunk or lost a rank",
    "buffers": "buffers of a kind, dtype, reduction or layout the lane does not take (not a contiguous, aligned, "
               "writable host array of a supported dtype; a GPU array on a host lane; a host array on the GPU "
               "lane)",
    "size": "empty, or larger than the lane's limit (the native program's bytes, AIOCCL_P2P_EAGER for messages)",
    "form": "a call form the lane has not learnt yet: the general way runs it this once and teaches the lane",
    "busy": "not now: the channel or engine has other ops in flight, or another thread holds the engine",
    "group": "issued inside comm.group(): the group launches its ops together",
    "learning": "jax_ext is learning on this thread what an op runs: the general way must build it",
    "spun": "a receive that spun for its message and saw none come: the engine posts it, without spinning again",
    "full": "a send whose FIFO stayed full while its loop was wanted: put off, sent from the loop",
    "device": "another device or stream than the learnt call's, or a CUDA graph being captured",
    "timeout": "the call names a timeout of its own: this lane's ops keep the communicator's deadline",
    "stream": "the call names a CUDA stream (stream=): only the GPU path orders ops on a stream",
    "wildcard": "ANY_SOURCE or ANY_TAG: only the engine matches wildcards",
    "kind": "an op this lane does not run (it runs only the collectives or messages it names)",
}


class Declined:
    """A lane's no, with its reason (a key of ``REASONS``). The native lanes return one shared instance per
    reason; compare reasons, not instances."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"Declined: unknown reason {reason!r} (answers.REASONS names them)")
        self.reason = reason

    def __repr__(self) -> str:
        return f"Declined({self.reason!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Declined) and other.reason == self.reason

    def __hash__(self) -> int:
        return hash(self.reason)


class Handover:
    """An op a native lane started in the call (it took the sequence number ``seq`` and channel order
    ``order``) and could not finish there: ``rc`` is where the protocol stopped. The engine carries it on.

    ``template``: the op the lane learnt the call's form from (``Op``'s fields as a tuple), or None for the
    small in-place all_reduce, whose op is built from ``inp`` and ``op``. ``given``: what the Work gives back
    (the array, the tensor the lane ran on a view of, a fresh array, or None)."""

    __slots__ = ("template", "inp", "out", "op", "rc", "seq", "order", "given")

    def __init__(self, template: Any, inp: Any, out: Any, op: Any, rc: int, seq: int, order: int,
                 given: Any) -> None:
        self.template, self.inp, self.out, self.op = template, inp, out, op
        self.rc, self.seq, self.order, self.given = rc, seq, order, given

    def __repr__(self) -> str:
        return f"Handover(seq={self.seq}, order={self.order}, rc={self.rc})"
