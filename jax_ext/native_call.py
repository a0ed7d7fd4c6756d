"""jax_ext's ops as native XLA custom calls: the native core runs them on XLA's buffers, without Python.

Each op lowers to its typed FFI handler (``aioccl_<op>``, in ``aioccl.native``'s extension, see
``aioccl/native/src/py/xla_ffi.c``) with one attribute, its *site*: the op, its parameters and shapes,
and the communicators it runs on, by mesh position. The handler finds the communicator from it.

Why learn from a first call: which schedule a communicator runs for a call, and whether the native
core can run it, are the engine's decisions (size, ranks, hosts, tuning). So the first call of each
site (and each member, and each aliasing of input and output) goes the engine's way, through the
fallback below, with the GIL; the op it runs is *captured*, and when it is one the core runs (a
small op of lockstep steps on a same-host channel, whose buffers are exactly XLA's), the site learns
its program. Later calls run it in C: the lane's counters, the channel's gate, the protocol. The
rest stay on the fallback for good: large ops, other hosts. A point-to-point op (``send``, ``recv``,
``sendrecv``, ``ppermute``) learns its peers and tag at its first call (``pair=`` of its primitive) and
runs from then on through its communicator's native point-to-point lane (``aioccl/lanes/pair.py``):
whatever the lane cannot take (a full FIFO, a message past the eager limit, a wildcard, a late peer)
comes back here, whole or with its send done (``PAIR_SENT``: the receive alone runs here).

An op the core started and cannot finish (a late peer past the spin, a failure) is carried on by
the engine from where the core left it (``aioccl.lowlevel.resume_native``): deadlines, verdicts,
lost peers and errors are the engine's, and the error text goes back to XLA (the exception itself
is kept for ``jax_ext.error_cause``).
"""

from __future__ import annotations

import itertools
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from aioccl import Communicator, lowlevel, native
from aioccl.algorithms.table import TABLE
from aioccl.dtypes import dtype_code
from aioccl.lanes.cpu import CAPTURE

from . import _compat, call_log
from .interrupts import Job, run_guarded, wait_guarded

ON_IN, ON_OUT, ON_NONE = 0, 1, 2
# the custom call targets, one native handler each: every collective of the table, then point-to-point. The
# native core takes the names from here (whether each is a collective too), so no list of them lives in C.
TARGETS: tuple[tuple[str, bool], ...] = (*((c.name, True) for c in TABLE), ("send", False), ("recv", False),
                                         ("sendrecv", False), ("ppermute", False))
NOT_NOW = -100  # the handler did not run the op: run it the engine's way (fast_lane.h's ACPY_LANE_NOT_NOW)
PAIR_SENT = -101  # the handler did a point-to-point op's send, not its receive (pair_lane.h's ACPY_PAIR_SENT)
_lock = threading.Lock()
_sites: dict[Any, int] = {}
_errors: OrderedDict[int, BaseException] = OrderedDict()  # the last errors reported to XLA, by number
_ERRORS_KEPT = 64
_numbers = itertools.count(1)
_ERROR_TAG = re.compile(r"\[jax_ext error (\d+)\]")
_registered: set[str] = set()  # platforms whose handlers XLA knows


def why_not(platform: str = "cpu") -> str | None:
    """None when custom calls run natively on ``platform`` ("cpu" or "cuda") here, else why not."""
    if platform == "cuda":
        from . import native_gpu

        why = native_gpu.why_not()
        if why is not None:
            return why
    elif platform != "cpu":
        return f"no native custom calls on {platform}"
    core = native.core
    if core is None:
        return f"the native core is not in use ({native.why_not or 'AIOCCL_NATIVE=0'})"
    if not hasattr(core, "ffi_handlers"):
        return "the native core was built without XLA's FFI headers (jaxlib was missing at build time)"
    return None


def _register(platform: str) -> None:
    with _lock:
        if platform not in _registered:
            core = native.core
            assert core is not None
            handlers = core.ffi_handlers(TARGETS)  # (names the kinds: the CUDA handlers' too)
            if platform == "cuda":
                handlers = core.ffi_gpu_handlers()
            for op, capsule in handlers.items():
                jax.ffi.register_ffi_target(f"aioccl_{op}", capsule, platform=platform.upper() if platform == "cuda"
                                            else platform, api_version=1)
            _registered.add(platform)


Replayable = Callable[..., bool]  # replayable(rank, same, **params): the run is the one op and nothing else
Pair = Callable[..., "tuple[int, int, int] | None"]  # pair(rank, **params): (dest, source, tag), -1: no such half


def site_maker(name: str, run: Callable[..., None], replayable: Replayable,
               pair: Pair | None = None) -> _compat.SiteMaker:
    """``make_site(info, avals_in, avals_out, group=..., **params)`` for ``_compat.def_lowering``: the site
    index of a lowering (made once per op, group, parameters and shapes), or None: a host callback instead."""

    def make(info: _compat.LoweringInfo, avals_in: Sequence[Any], avals_out: Sequence[Any], *, group: Any,
             **params: Any) -> int | None:
        if why_not(info.platform) is not None:
            return None
        resolve = group.resolver(info)
        table = getattr(resolve, "table", None)  # a mesh group's communicators by position (else one)
        shapes = tuple((tuple(a.shape), str(a.dtype)) for a in (*avals_in, *avals_out))
        key = (info.platform, name, group, id(table), tuple(sorted((k, _keyable(v)) for k, v in params.items())),
               shapes)
        with _lock:
            ix = _sites.get(key)
        if ix is not None:
            return ix
        _register(info.platform)
        members = getattr(resolve, "members", 1)
        site = Site(name, run, replayable, resolve, avals_in[:-1], avals_out, params, pair)
        with _lock:
            ix = _sites.get(key)
            if ix is None:
                gpu = site.gpu_fallback if info.platform == "cuda" else None
                ix = _sites[key] = site.index = native.core.ffi_site(name, members, site.fallback, gpu)  # type: ignore[union-attr]
        return ix

    return make


def _keyable(v: Any) -> Any:
    """A parameter as part of a site's key: itself when hashable, else its identity (a ``Status`` the op
    fills in is that object, not an equal one; the site keeps it alive, so the id stays its own)."""
    try:
        hash(v)
    except TypeError:
        return ("id", id(v))
    return v


class Site:
    """One lowered op: the Python side of its native handler (first calls, fallback, carrying on)."""

    def __init__(self, name: str, run: Callable[..., None], replayable: Replayable, resolve: Any,
                 avals_in: Sequence[Any], avals_out: Sequence[Any], params: dict[str, Any],
                 pair: Pair | None = None) -> None:
        self.name, self.run, self.replayable, self.resolve, self.params = name, run, replayable, resolve, params
        self.pair = pair
        self.pairs: dict[int, tuple[int, int, int] | None] = {}  # position -> its point-to-point op, as taught
        self.ins = [(np.dtype(a.dtype), tuple(a.shape)) for a in avals_in]
        self.outs = [(np.dtype(a.dtype), tuple(a.shape)) for a in avals_out]
        self.index = -1
        self.what = f"{name}({params['op']})" if "op" in params else name
        # (position, variant) -> the op it learnt from, and which of XLA's buffers its IN and OUT are
        self.templates: dict[tuple[int, int], tuple[Any, int, int]] = {}
        self.members: set[int] = set()
        self.carrying: dict[int, tuple[int, Job]] = {}  # position -> the op the core started last, its job

    def fallback(self, pos: int, variant: int, rc: int, seq: int, order: int, ins: list[memoryview],
                 outs: list[memoryview]) -> None:
        """The handler's way into Python (with the GIL): run the op the engine's way and learn it, or carry on
        an op the core started. An exception's text becomes the XLA error; the exception is kept. A started
        op must be taken on: an exception before it was is raised as it is, untagged, and the handler calls
        again."""
        try:
            comm = self.resolve(lambda: pos)
            arrays = [np.frombuffer(b, d).reshape(s) for b, (d, s) in zip(ins, self.ins, strict=True)]
            outs_ = [np.frombuffer(b, d).reshape(s) for b, (d, s) in zip(outs, self.outs, strict=True)]
            if lowlevel.on_engine_thread(comm):
                raise RuntimeError(f"{comm!r}: a jax_ext collective ran on its communicator's engine thread, "
                                   "where waiting would deadlock; create it with engine='thread'")
            if not call_log.get_logging():
                self._call(comm, pos, variant, rc, seq, order, arrays, outs_)
                return
            items = math.prod(arrays[0].shape) if arrays else 0
            with call_log.logged(comm.rank, self.what, items, ""):
                self._call(comm, pos, variant, rc, seq, order, arrays, outs_)
        except BaseException as e:  # noqa: BLE001 - reported to XLA as its text, kept for error_cause
            if rc not in (NOT_NOW, PAIR_SENT) and not self._carried(pos, seq):
                raise  # a started op not taken on yet (an interrupt on the way in): the handler calls again
            raise RuntimeError(report(e)) from None

    def gpu_fallback(self, stream: int, where: int, ins: list[tuple[int, int]], outs: list[tuple[int, int]]) -> None:
        """The CUDA handler's way into Python (native_gpu.py): the op on XLA's buffers and stream; learnt."""
        from . import native_gpu

        native_gpu.fallback(self, stream, where, ins, outs)

    def _call(self, comm: Communicator, pos: int, variant: int, rc: int, seq: int, order: int,
              ins: list[np.ndarray], outs: list[np.ndarray]) -> None:
        if comm.world_size == 1 and lowlevel.fast_lane(comm) is not None and pos not in self.members:
            with _lock:  # one rank: the handler gives the input back itself from the next call on
                native.core.ffi_member(self.index, pos, lowlevel.fast_lane(comm))  # type: ignore[union-attr]
                self.members.add(pos)
        if rc == PAIR_SENT:  # the core sent; the receive is the engine's (dropped by an interrupt: withdrawn)
            _, source, tag = self.pairs[pos] or (-1, -1, -1)
            run_guarded(lambda c, a, b, same: c.irecv(b[0], source, tag).wait(), comm, ins, outs, bool(variant))
            return
        if rc != NOT_NOW:
            wait_guarded(self._carrier(comm, pos, variant, rc, seq, order, ins, outs))
            return

        def learning(comm: Communicator, a: list[Any], b: list[Any], same: bool, **params: Any) -> None:
            with CAPTURE.learning() as ops:  # (the fast lane stands aside meanwhile: the op must be built to be seen)
                self.run(comm, a, b, same, **params)
            self._learn(comm, pos, variant, ops, a, b, same)

        if self.pair is not None:
            run_guarded(self.run, comm, ins, outs, bool(variant), **self.params)
            if pos not in self.pairs:
                self._learn_pair(comm, pos)
            return
        run = learning if (pos, variant) not in self.templates else self.run
        run_guarded(run, comm, ins, outs, bool(variant), **self.params)

    def _learn_pair(self, comm: Communicator, pos: int) -> None:
        """Teach the handler this member's point-to-point op, run from then on by the communicator's native
        lane (``aioccl/lanes/pair.py``), when it has one and the op is one the lane runs."""
        core, lane = native.core, lowlevel.pair_lane(comm)
        assert self.pair is not None
        peers = self.pairs[pos] = self.pair(rank=comm.rank, **self.params)
        if core is None or lane is None or peers is None or comm.rank in peers[:2]:
            return
        dest, source, tag = peers
        try:
            codes = (dtype_code(self.ins[0][0]) if dest >= 0 else 0, dtype_code(self.outs[0][0]) if source >= 0 else 0)
        except (TypeError, ValueError, IndexError):
            return  # (a dtype the frames do not carry: the engine's way says so)
        with _lock:
            core.ffi_pair(self.index, pos, lane, dest, source, tag, *codes)

    def _carrier(self, comm: Communicator, pos: int, variant: int, rc: int, seq: int, order: int,
                 ins: list[np.ndarray], outs: list[np.ndarray]) -> Job:
        """The job that carries on the op the core started as ``seq`` at ``pos``, made once: the handler's
        call again after an interrupt on the way in (xla_ffi.c) finds it, rather than resume the op twice."""
        made = self.carrying.get(pos)
        if made is not None and made[0] == seq:
            return made[1]
        template, in_is, out_is = self.templates[(pos, variant)]
        buf = {ON_IN: ins[0] if ins else None, ON_OUT: outs[0] if outs else None}
        inp, out = buf.get(in_is), buf.get(out_is)
        job = Job(lambda: lowlevel.resume_native(comm, template, rc, seq, order,
                                              template.inp if inp is None else inp.reshape(-1),
                                              template.out if out is None else out.reshape(-1)).wait())
        self.carrying[pos] = (seq, job)
        return job

    def _carried(self, pos: int, seq: int) -> bool:
        """Whether the op the core started as ``seq`` at ``pos`` was taken on and has ended."""
        made = self.carrying.get(pos)
        return made is not None and made[0] == seq and made[1].done.is_set()

    def _learn(self, comm: Communicator, pos: int, variant: int, ops: list[tuple[Any, Any]], ins: list[Any],
               outs: list[Any], same: bool) -> None:
        """Teach the handler the op just run, when the core can run it again on XLA's buffers alone."""
        core, lane, shm = native.core, lowlevel.fast_lane(comm), lowlevel.channel(comm)
        if (len(ops) != 1 or ops[0][1] is None or core is None or lane is None or shm is None
                or shm.native is None or not self.replayable(rank=comm.rank, same=same, **self.params)):
            return
        op, program = ops[0]
        in_is, out_is = _role(op.inp, ins, outs), _role(op.out, ins, outs)
        if in_is is None or out_is is None:
            return
        with _lock:
            if pos not in self.members:
                core.ffi_member(self.index, pos, lane)
                self.members.add(pos)
            self.templates[(pos, variant)] = (op, in_is, out_is)
            core.ffi_learn(self.index, pos, variant, program, op.dtype_code, op.fp[2], in_is, out_is)


def _role(a: np.ndarray, ins: list[Any], outs: list[Any]) -> int | None:
    """Which of the call's buffers ``a`` (an op's flat IN or OUT) is exactly, if any."""
    if a.nbytes == 0:
        return ON_NONE
    at = a.__array_interface__["data"][0]
    for which, bufs in ((ON_IN, ins), (ON_OUT, outs)):
        if bufs and bufs[0].nbytes == a.nbytes and bufs[0].__array_interface__["data"][0] == at:
            return which
    return None


def report(e: BaseException) -> str:
    """The text an XLA error carries for ``e`` (kept, numbered, for ``error_cause``)."""
    with _lock:
        n = next(_numbers)
        _errors[n] = e
        while len(_errors) > _ERRORS_KEPT:
            _errors.popitem(last=False)
    return f"{type(e).__name__}: {e} [jax_ext error {n}]"


def error_cause(exc: BaseException) -> BaseException | None:
    """The aioccl exception behind a JAX error raised by a jax_ext op (``JaxRuntimeError``), or None.

    XLA passes an FFI handler's error on as text, so the exception itself is kept here (the last 64)
    and found again from the number its text ends with::

        try:
            step(x)
        except jax.errors.JaxRuntimeError as e:
            cause = jax_ext.error_cause(e)
            if isinstance(cause, aioccl.CollectiveTimeout): ...
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        m = _ERROR_TAG.search(str(exc))
        if m is not None:
            with _lock:
                return _errors.get(int(m.group(1)))
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return None


def stats() -> dict[str, int]:
    """Custom calls so far: done in C (``native``), started in C and carried on by the engine (``carried``: a
    peer came later than the spin), run through Python (``python``: first calls, ops the core does not run),
    of those, the ones passed on only for timing (``busy``: the engine held by earlier ops, a message not come
    within the spin, a full FIFO), with the output on the input (``in_place``); and the sites made. For tests
    and tuning."""
    core = native.core
    return dict(core.ffi_stats()) if core is not None and hasattr(core, "ffi_stats") else {}
