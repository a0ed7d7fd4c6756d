"""The collectives' argument handling: shapes, in place or not, which buffer is IN and OUT.

The same checks serve host and GPU buffers; ``stream=`` orders an op on GPU
buffers on that CUDA stream (default: the current one, see docs/gpu.md).

The general way's collectives (``GeneralCollectives``, a part of each ``Communicator``): a public
collective goes through the communicator's door (``lanes/door.py``), which offers it to the lanes in one
order; the last of them, the general way, runs the ``_<collective>`` method here: it validates (raising
``InvalidArgument`` before anything is sent), decides the buffers and the result, and hands them to the
launcher (``launch.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .algorithms.table import BY_NAME
from .buffers import Buf, adapt, fresh, need_writable, no_foreign_overlap, output_like, overlaps, same_or_disjoint
from .dtypes import ReduceOp, check_op_dtype, dtype_code
from .errors import InvalidArgument
from .lanes.cpu import TEACHING
from .work import Work

if TYPE_CHECKING:
    from .engine.view import CommView
    from .lanes.call import Call
    from .launch import Launcher

_CODES = {name: BY_NAME[name].code for name in ("all_reduce", "broadcast", "all_gather", "reduce_scatter",
                                                 "all_to_all", "reduce", "gather", "scatter", "scan")}
_BARRIER = BY_NAME["barrier"].code
_ALL_REDUCE = _CODES["all_reduce"]


class GeneralCollectives:
    """The general way of every collective of one communicator (``view``), started by ``launcher``."""

    def __init__(self, view: CommView, launcher: Launcher) -> None:
        self._view = view
        self._collective = launcher.collective
        self._by_code: dict[int, Callable[[Call], Work[Any]]] = {  # each collective's general way, by its code
            _ALL_REDUCE: functools.partial(self._elementwise, "all_reduce"),
            _CODES["scan"]: functools.partial(self._elementwise, "scan"),
            _CODES["broadcast"]: self._broadcast,
            _CODES["reduce"]: self._reduce,
            _CODES["all_gather"]: self._all_gather,
            _CODES["reduce_scatter"]: self._reduce_scatter,
            _CODES["gather"]: self._gather,
            _CODES["scatter"]: self._scatter,
            _CODES["all_to_all"]: self._all_to_all,
            _BARRIER: self._barrier,
        }

    def _root(self, root: int) -> int:
        if not isinstance(root, (int, np.integer)) or not 0 <= root < self._view.size:
            raise InvalidArgument(f"root {root!r} out of range for a communicator of {self._view.size} ranks")
        return int(root)

    @staticmethod
    def _in_place(x: Buf, name: str = "x") -> Buf:
        """The buffer an in-place op writes: ``x`` itself, or a fresh copy for immutable (JAX) arrays
        (on a GPU, the copy is queued on the current stream)."""
        if x.immutable:
            copy = fresh(x.array.shape, x)
            copy.array[...] = x.array
            return copy
        need_writable(x, name)
        return x

    def _blocks(self, x: Buf, name: str = "x") -> tuple[int, ...]:
        shape = x.array.shape
        if not shape or shape[0] % self._view.size:
            raise InvalidArgument(f"{name}.shape[0] must be a multiple of the {self._view.size} ranks, "
                                  f"got shape {shape}")
        return (shape[0] // self._view.size, *shape[1:])

    def _elementwise(self, name: str, k: Call) -> Work[Any]:
        """all_reduce and scan: a reduction whose result has x's shape, in place unless ``out`` is given."""
        x, op, out, timeout, stream = k.x, k.op, k.out, k.timeout, k.stream
        xb = adapt(x, "x")
        rop = ReduceOp.parse(op)
        check_op_dtype(rop, xb.array.dtype)
        ob = self._in_place(xb) if out is None else same_or_disjoint(name, xb, out)
        inp = ob if (out is None and xb.immutable) else xb
        return self._collective(name, xb.array.size, 0, inp, ob, rop, lambda: ob.wrap(ob.array), timeout,
                                stream=stream)

    def _broadcast(self, k: Call) -> Work[Any]:
        x, out, timeout, stream = k.x, k.out, k.timeout, k.stream
        root = self._root(k.root)
        xb = adapt(x, "x")
        if out is not None:
            ob = same_or_disjoint("broadcast", xb, out)
        elif self._view.rank == root and not xb.immutable:
            ob = xb
        else:
            ob = self._in_place(xb)
        inp = xb if self._view.rank == root else ob
        return self._collective("broadcast", xb.array.size, root, inp, ob, None, lambda: ob.wrap(ob.array), timeout,
                                stream=stream)

    def _reduce(self, k: Call) -> Work[Any]:
        x, op, out, timeout, stream = k.x, k.op, k.out, k.timeout, k.stream
        root = self._root(k.root)
        xb = adapt(x, "x")
        rop = ReduceOp.parse(op)
        check_op_dtype(rop, xb.array.dtype)
        if out is not None and self._view.rank == root:
            ob = same_or_disjoint("reduce", xb, out)
        elif out is not None:
            ob = output_like(xb, out, xb.array.shape)  # checked, never written on non-root ranks
        elif self._view.rank == root:
            ob = self._in_place(xb)
        else:
            ob = xb  # never written on non-root ranks
        is_root = self._view.rank == root
        inp = ob if (out is None and xb.immutable and is_root) else xb
        return self._collective("reduce", xb.array.size, root, inp, ob, rop,
                                lambda: ob.wrap(ob.array) if is_root else None, timeout, stream=stream)

    def _all_gather(self, k: Call) -> Work[Any]:
        x, out, timeout, stream = k.x, k.out, k.timeout, k.stream
        xb = adapt(x, "x")
        shape = xb.array.shape
        oshape = (self._view.size * shape[0], *shape[1:]) if shape else (self._view.size,)
        ob = output_like(xb, out, oshape)
        no_foreign_overlap(xb, ob, self._view.rank, "all_gather")
        return self._collective("all_gather", xb.array.size, 0, xb, ob, None, lambda: ob.wrap(ob.array), timeout,
                                stream=stream)

    def _reduce_scatter(self, k: Call) -> Work[Any]:
        x, op, out, timeout, stream = k.x, k.op, k.out, k.timeout, k.stream
        xb = adapt(x, "x")
        rop = ReduceOp.parse(op)
        check_op_dtype(rop, xb.array.dtype)
        bshape = self._blocks(xb)
        if out is None:
            whole = self._in_place(xb)
            b = bshape[0]
            ob = Buf(whole.array[self._view.rank * b:(self._view.rank + 1) * b], True, whole.wrap, immutable=False)
            xb = whole
        else:
            ob = output_like(xb, out, bshape)
            no_foreign_overlap(ob, xb, self._view.rank, "reduce_scatter")
        count = int(np.prod(bshape))
        return self._collective("reduce_scatter", count, 0, xb, ob, rop, lambda: ob.wrap(ob.array), timeout,
                                stream=stream)

    def _gather(self, k: Call) -> Work[Any]:
        x, out, timeout, stream = k.x, k.out, k.timeout, k.stream
        root = self._root(k.root)
        xb = adapt(x, "x")
        shape = xb.array.shape
        oshape = (self._view.size * shape[0], *shape[1:]) if shape else (self._view.size,)
        if self._view.rank == root:
            ob = output_like(xb, out, oshape)
            no_foreign_overlap(xb, ob, root, "gather")
        else:
            ob = xb
        is_root = self._view.rank == root
        return self._collective("gather", xb.array.size, root, xb, ob, None,
                                lambda: ob.wrap(ob.array) if is_root else None, timeout, stream=stream)

    def _scatter(self, k: Call) -> Work[Any]:
        x, out, timeout, stream = k.x, k.out, k.timeout, k.stream
        root = self._root(k.root)
        if self._view.rank == root:
            xb = adapt(x, "x")
            bshape = self._blocks(xb)
            b = bshape[0]
            if out is None:
                ob = Buf(xb.array[root * b:(root + 1) * b], xb.writable, xb.wrap, immutable=xb.immutable)
            else:
                ob = output_like(xb, out, bshape)
                no_foreign_overlap(ob, xb, root, "scatter")
        elif out is not None:
            ob = adapt(out, "out")
            need_writable(ob, "out")
            dtype_code(ob.array.dtype)
            xb = ob
        elif x is not None:
            whole = self._in_place(adapt(x, "x"))
            b = self._blocks(whole)[0]
            ob = Buf(whole.array[self._view.rank * b:(self._view.rank + 1) * b], True, whole.wrap)
            xb = ob
        else:
            raise InvalidArgument("scatter: non-root ranks must pass out= (or a full-size x to scatter into)")
        count = ob.array.size
        return self._collective("scatter", count, root, xb, ob, None, lambda: ob.wrap(ob.array), timeout, stream=stream)

    def _all_to_all(self, k: Call) -> Work[Any]:
        x, out, timeout, stream = k.x, k.out, k.timeout, k.stream
        xb = adapt(x, "x")
        bshape = self._blocks(xb)
        if out is None:
            ob = self._in_place(xb)
            in_place = True
        else:
            ob = output_like(xb, out, xb.array.shape)
            if overlaps(ob.array, xb.array):
                raise InvalidArgument("all_to_all: out overlaps x (each rank's block is read after others are "
                                      "written); omit out= for in place")
            in_place = False
        count = int(np.prod(bshape))
        inp = ob if in_place else xb
        return self._collective("all_to_all", count, 0, inp, ob, None, lambda: ob.wrap(ob.array), timeout,
                                in_place=in_place, stream=stream)

    def _barrier(self, k: Call) -> Work[None]:
        timeout = k.timeout
        empty = Buf(np.zeros(0, dtype=np.uint8), True, lambda a: None)
        return self._collective("barrier", 0, 0, empty, empty, None, lambda: None, timeout)

    # -- the general way (lanes/general.py): every call the faster lanes declined ------------------------
    def run(self, call: Call) -> Work[Any]:
        """The general way of one call: its collective's argument handling above, then ``_collective``. A call
        the CPU lane declined as a form it has not learnt teaches it (``call.teach``: lanes/cpu.py's ``teach``
        reads it as the op is built, on this thread)."""
        if call.teach is None:
            return self._by_code[call.code](call)
        TEACHING.call = call.teach
        try:
            return self._by_code[call.code](call)
        finally:
            TEACHING.call = None
