"""The call record: what a public op was called with, made once at the door, each buffer classified once.

NCCL fills one ``ncclInfo`` per collective for one ``ncclEnqueueCheck``; aioccl's door fills one ``Call`` for
the lanes it tries in order (``door.py``). It is made only when the first lane's native entry, tried on the
caller's own arguments, did not take the call: on the hot path no record is built at all.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..algorithms.table import BY_CODE, BY_NAME
from ..envvars import check_timeout
from ..errors import InvalidArgument
from ..native.answers import Declined

_NDARRAY = np.ndarray  # (one global look-up, not two, per buffer: the record is made on every declined call)
NOT_HOST = object()  # a buffer that is not in host memory as the host lanes take it: the general way's

# what a call's buffers are, as the lanes ask (the first that fits both x and out)
NONE, HOST, TENSOR, OTHER = "none", "host", "tensor", "other"


def host_view(x: Any) -> Any:
    """``x`` as the host lanes take it: a numpy array or None as it is, a dense CPU torch tensor as its numpy
    view; ``NOT_HOST`` for anything else (the general way: JAX arrays, GPU arrays, bfloat16 tensors...)."""
    if x is None or x.__class__ is np.ndarray:
        return x
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(x, torch.Tensor) or x.is_cuda:  # (a CUDA tensor's numpy() raises: ~10 us)
        return NOT_HOST
    try:  # a CPU tensor of a numpy dtype, without grad; a bfloat16, sparse or meta one raises (the general way)
        return x.numpy()
    except (RuntimeError, TypeError):
        return NOT_HOST


class Call:
    """One call of a public op, as the lanes see it.

    ``code``: the collective's wire code (``algorithms/table.py``), or ``SEND`` / ``RECV`` for messages;
    ``x``, ``out``: the caller's buffers (``out`` None: in place; for a message ``x`` is the array sent or
    received into); ``op``, ``root`` (the peer, for a message), ``tag``; ``timeout`` (checked here: a bad one
    raises before anything is sent) and ``stream`` as given. ``xa``, ``oa``: the buffers as the host lanes
    take them (``host_view``); ``kind``: ``"host"`` (numpy arrays or None), ``"tensor"`` (CPU tensors, viewed),
    ``"none"`` (no buffers: a barrier) or ``"other"`` (GPU, JAX, anything the host lanes do not take).
    ``first``: what the first lane's native entry answered on the raw arguments (a ``Declined``), or None
    when it was not tried (a timeout or a stream was given). ``teach``: what the CPU lane learns this call's
    form by, when it declined it as ``form`` (the general way runs it and teaches the lane on this thread)."""

    __slots__ = ("code", "x", "out", "op", "root", "tag", "timeout", "stream", "xa", "oa", "kind", "first", "teach")

    def __init__(self, code: int, x: Any, out: Any, op: Any, root: Any, timeout: float | None, stream: Any,
                 first: Declined | None = None, tag: Any = 0) -> None:
        if timeout is not None:
            check_timeout(timeout)  # a bad one raises here, before any lane or byte
        self.code = code
        self.x = x
        self.out = out
        self.op = op
        self.root = root
        self.tag = tag
        self.timeout = timeout
        self.stream = stream
        self.first = first
        self.teach: tuple[Any, ...] | None = None  # set by the CPU lane for a form it learns from the general way
        self.xa = xa = x if x is None or x.__class__ is _NDARRAY else host_view(x)
        self.oa = oa = out if out is None or out.__class__ is _NDARRAY else host_view(out)
        if xa is x and oa is out:
            self.kind = NONE if x is None and out is None else HOST
        elif xa is NOT_HOST or oa is NOT_HOST:
            self.kind = OTHER
        else:
            self.kind = TENSOR

    @property
    def name(self) -> str:
        return BY_CODE[self.code].name if self.code in BY_CODE else MESSAGES.get(self.code, f"op {self.code}")

    def describe(self) -> str:
        """The call's form in a few words, for the LANES log and ``explain``."""
        def buf(a: Any) -> str:
            if a is None:
                return "None"
            shape = getattr(a, "shape", "?")
            return f"{type(a).__name__}{list(shape) if isinstance(shape, tuple) else shape} {getattr(a, 'dtype', '?')}"
        parts = [f"x={buf(self.x)}"]
        if self.code not in MESSAGES:
            parts.append(f"out={buf(self.out)}")
        if self.timeout is not None:
            parts.append(f"timeout={self.timeout:g}")
        if self.stream is not None:
            parts.append("stream=...")
        return f"{self.name}({', '.join(parts)})"


SEND, RECV = -1, -2  # a message's codes (collectives' codes are positive)
MESSAGES = {SEND: "isend", RECV: "irecv"}


def call_of(op: str, x: Any, out: Any, reduce: Any, root: Any, tag: Any, timeout: float | None, stream: Any) -> Call:
    """The record of a call named by its op (``comm.explain``): a collective's name, ``isend`` or ``irecv``."""
    codes = {name: code for code, name in MESSAGES.items()}
    if op in codes:
        return Call(codes[op], x, None, None, root, timeout, stream, None, tag)
    if op not in BY_NAME:
        raise InvalidArgument(f"explain: no op {op!r}; one of {sorted(BY_NAME) + sorted(codes)}")
    c = BY_NAME[op]
    return Call(c.code, x, out, reduce if c.reduces else None, root if c.rooted else 0, timeout, stream)
