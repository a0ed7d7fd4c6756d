"""The collectives' argument handling: shapes, in place or not, which buffer is IN and OUT.

The same checks serve host and GPU buffers; ``stream=`` orders an op on GPU
buffers on that CUDA stream (default: the current one, see docs/gpu.md).

A mixin of ``Communicator``: each method validates
(raising ``InvalidArgument`` before anything is sent), decides the
buffers and the result, and hands them to ``Communicator._collective``.
Each first offers the call to the CPU lane inline (a helper's frame: a tenth of a 2 us op).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .algorithms.table import BY_NAME
from .buffers import Buf, adapt, fresh, need_writable, no_foreign_overlap, output_like, overlaps, same_or_disjoint
from .dtypes import ReduceOp, check_op_dtype, dtype_code
from .errors import InvalidArgument
from .fast_lane import CAPTURE, NOT_HOST, host_view
from .work import Work

_CODES = {name: BY_NAME[name].code for name in ("all_reduce", "broadcast", "all_gather", "reduce_scatter",
                                                 "all_to_all", "reduce", "gather", "scatter", "scan")}
_BARRIER = BY_NAME["barrier"].code


def _lane_tensor(lane: Any, x: Any, op: ReduceOp | str) -> Any:
    """The fast lane for a dense contiguous CPU torch tensor (through its numpy view), else None."""
    view = host_view(x)
    if view is NOT_HOST or view is None:
        return None
    return lane.all_reduce(view, op, x)  # the lane refuses a non-contiguous view (the general way says why)


class CollectiveOps:
    if TYPE_CHECKING:
        @property
        def rank(self) -> int: ...

        @property
        def world_size(self) -> int: ...

        def _root(self, root: int) -> int: ...

        _lane: Any
        _gpu_lane: Any  # the GPU lane, once the device path runs ops (gpu/lane.py)
        _gpu: Any

        def _carry_on(self, x: Any, op: ReduceOp | str, handed: tuple[Any, ...],
                      timeout: float | None = None) -> Work[Any]: ...

        def _op_timeout(self, timeout: float | None) -> float: ...

        def _by_lane(self, code: int, x: Any, out: Any, op: Any, root: int, timeout: float | None,
                     general: Callable[[], Work[Any]], tried: Any = False) -> Work[Any] | None: ...

        def _collective(self, name: str, count: int, root: int, inp: Buf, out: Buf, op: ReduceOp | None,
                        result: Callable[[], Any], timeout: float | None, in_place: bool = False,
                        stream: Any = None) -> Work[Any]: ...

    def _via_gpu_lane(self, name: str, x: Any, out: Any, op: Any, root: int,
                      general: Callable[[], Work[Any]]) -> Work[Any]:
        """A collective while the GPU lane is up (gpu/lane.py): a call seen before runs in C, from the call to
        the done Work; any other call goes ``general``, after which the lane learns it if it can."""
        code = _CODES[name]
        if CAPTURE.ops is not None:  # jax_ext learning what a CUDA custom call launches (fast_lane.CAPTURE)
            w: Work[Any] = self._gpu.learning(code, x, out, op, root, general)
            CAPTURE.ops.append(("gpu", *self._gpu.launched(w, code)))
            return w
        got: Work[Any] | None = self._gpu_lane.run(code, x, out, op, root)
        return got if got is not None else self._gpu.learning(code, x, out, op, root, general)

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
        if not shape or shape[0] % self.world_size:
            raise InvalidArgument(f"{name}.shape[0] must be a multiple of the {self.world_size} ranks, "
                                  f"got shape {shape}")
        return (shape[0] // self.world_size, *shape[1:])

    # -- collectives -----------------------------------------------------------
    def all_reduce(self, x: Any, op: ReduceOp | str = "sum", out: Any = None, *,
                   timeout: float | None = None, stream: Any = None) -> Work[Any]:
        """Reduce ``x`` across ranks; in place unless ``out`` is given. Awaits to the result."""
        lane = self._lane
        if lane is not None and out is None and stream is None and CAPTURE.ops is None:
            if timeout is not None:
                self._op_timeout(timeout)  # a bad one raises here, before anything is sent
            # the native core's small op, done in this call (shm_native.py): a numpy array, or a CPU tensor's view
            # (not while jax_ext learns what an op runs: it must see the op built, fast_lane.CAPTURE)
            w = lane.all_reduce(x, op) if x.__class__ is np.ndarray else _lane_tensor(lane, x, op)
            if w is not None:
                return w if w.__class__ is Work else self._carry_on(x, op, w, timeout)
        elif lane is not None and stream is None:  # out=: a call of a form the lane knows (fast_lane.py)
            w = lane.run(_CODES["all_reduce"], x, out, op, 0) if timeout is None else False
            if w.__class__ is Work:
                return w
            w = self._by_lane(_CODES["all_reduce"], x, out, op, 0, timeout,
                              lambda: self._elementwise("all_reduce", x, op, out, timeout, None), w)
            if w is not None:
                return w
        if self._gpu_lane is not None and stream is None and timeout is None:  # GPU buffers: the native lane
            return self._via_gpu_lane("all_reduce", x, out, op, 0,
                                      lambda: self._elementwise("all_reduce", x, op, out, None, None))
        return self._elementwise("all_reduce", x, op, out, timeout, stream)

    def scan(self, x: Any, op: ReduceOp | str = "sum", out: Any = None, *,
             timeout: float | None = None, stream: Any = None) -> Work[Any]:
        """Inclusive prefix reduction (``MPI_Scan``): rank r gets ``x_0 op ... op x_r``, folded in rank order;
        ``avg`` divides by r + 1. In place unless ``out`` is given. Awaits to the result."""
        lane = self._lane
        if lane is not None and stream is None:  # a call of a form the lane knows: done in C (fast_lane.py)
            w = lane.run(_CODES["scan"], x, out, op, 0) if timeout is None else False
            if w.__class__ is Work:
                return w
            w = self._by_lane(_CODES["scan"], x, out, op, 0, timeout,
                              lambda: self._elementwise("scan", x, op, out, timeout, None), w)
            if w is not None:
                return w
        if self._gpu_lane is not None and stream is None and timeout is None:
            return self._via_gpu_lane("scan", x, out, op, 0,
                                      lambda: self._elementwise("scan", x, op, out, None, None))
        return self._elementwise("scan", x, op, out, timeout, stream)

    def _elementwise(self, name: str, x: Any, op: ReduceOp | str, out: Any, timeout: float | None,
                     stream: Any) -> Work[Any]:
        """all_reduce and scan: a reduction whose result has x's shape, in place unless ``out`` is given."""
        xb = adapt(x, "x")
        rop = ReduceOp.parse(op)
        check_op_dtype(rop, xb.array.dtype)
        ob = self._in_place(xb) if out is None else same_or_disjoint(name, xb, out)
        inp = ob if (out is None and xb.immutable) else xb
        return self._collective(name, xb.array.size, 0, inp, ob, rop, lambda: ob.wrap(ob.array), timeout,
                                stream=stream)

    def broadcast(self, x: Any, root: int = 0, out: Any = None, *, timeout: float | None = None,
                  stream: Any = None) -> Work[Any]:
        """Copy root's ``x`` into every rank's ``x``, or into ``out`` where given (a new array for JAX)."""
        lane = self._lane
        if lane is not None and stream is None:  # a call of a form the lane knows: done in C (fast_lane.py)
            w = lane.run(_CODES["broadcast"], x, out, None, root) if timeout is None else False
            if w.__class__ is Work:
                return w
            w = self._by_lane(_CODES["broadcast"], x, out, None, root, timeout,
                              lambda: self._broadcast(x, root, out, timeout, None), w)
            if w is not None:
                return w
        if self._gpu_lane is not None and stream is None and timeout is None:
            return self._via_gpu_lane("broadcast", x, out, None, root,
                                      lambda: self._broadcast(x, root, out, None, None))
        return self._broadcast(x, root, out, timeout, stream)

    def _broadcast(self, x: Any, root: int, out: Any, timeout: float | None, stream: Any) -> Work[Any]:
        root = self._root(root)
        xb = adapt(x, "x")
        if out is not None:
            ob = same_or_disjoint("broadcast", xb, out)
        elif self.rank == root and not xb.immutable:
            ob = xb
        else:
            ob = self._in_place(xb)
        inp = xb if self.rank == root else ob
        return self._collective("broadcast", xb.array.size, root, inp, ob, None, lambda: ob.wrap(ob.array), timeout,
                                stream=stream)

    def reduce(self, x: Any, root: int = 0, op: ReduceOp | str = "sum", out: Any = None, *,
               timeout: float | None = None, stream: Any = None) -> Work[Any]:
        """Reduce onto ``root`` (into ``out`` or, by default, root's ``x``); None on other ranks."""
        lane = self._lane
        if lane is not None and stream is None:  # a call of a form the lane knows: done in C (fast_lane.py)
            w = lane.run(_CODES["reduce"], x, out, op, root) if timeout is None else False
            if w.__class__ is Work:
                return w
            w = self._by_lane(_CODES["reduce"], x, out, op, root, timeout,
                              lambda: self._reduce(x, root, op, out, timeout, None), w)
            if w is not None:
                return w
        if self._gpu_lane is not None and stream is None and timeout is None:
            return self._via_gpu_lane("reduce", x, out, op, root,
                                      lambda: self._reduce(x, root, op, out, None, None))
        return self._reduce(x, root, op, out, timeout, stream)

    def _reduce(self, x: Any, root: int, op: ReduceOp | str, out: Any, timeout: float | None,
                stream: Any) -> Work[Any]:
        root = self._root(root)
        xb = adapt(x, "x")
        rop = ReduceOp.parse(op)
        check_op_dtype(rop, xb.array.dtype)
        if out is not None and self.rank == root:
            ob = same_or_disjoint("reduce", xb, out)
        elif out is not None:
            ob = output_like(xb, out, xb.array.shape)  # checked, never written on non-root ranks
        elif self.rank == root:
            ob = self._in_place(xb)
        else:
            ob = xb  # never written on non-root ranks
        is_root = self.rank == root
        inp = ob if (out is None and xb.immutable and is_root) else xb
        return self._collective("reduce", xb.array.size, root, inp, ob, rop,
                                lambda: ob.wrap(ob.array) if is_root else None, timeout, stream=stream)

    def all_gather(self, x: Any, out: Any = None, *, timeout: float | None = None,
                  stream: Any = None) -> Work[Any]:
        """Concatenate every rank's ``x`` along axis 0 (0-d inputs give shape ``(n,)``)."""
        lane = self._lane
        if lane is not None and stream is None:  # a call of a form the lane knows: done in C (fast_lane.py)
            w = lane.run(_CODES["all_gather"], x, out, None, 0) if timeout is None else False
            if w.__class__ is Work:
                return w
            w = self._by_lane(_CODES["all_gather"], x, out, None, 0, timeout,
                              lambda: self._all_gather(x, out, timeout, None), w)
            if w is not None:
                return w
        if self._gpu_lane is not None and stream is None and timeout is None and out is not None:
            return self._via_gpu_lane("all_gather", x, out, None, 0,
                                      lambda: self._all_gather(x, out, None, None))
        return self._all_gather(x, out, timeout, stream)

    def _all_gather(self, x: Any, out: Any, timeout: float | None, stream: Any) -> Work[Any]:
        xb = adapt(x, "x")
        shape = xb.array.shape
        oshape = (self.world_size * shape[0], *shape[1:]) if shape else (self.world_size,)
        ob = output_like(xb, out, oshape)
        no_foreign_overlap(xb, ob, self.rank, "all_gather")
        return self._collective("all_gather", xb.array.size, 0, xb, ob, None, lambda: ob.wrap(ob.array), timeout,
                                stream=stream)

    def reduce_scatter(self, x: Any, op: ReduceOp | str = "sum", out: Any = None, *,
                       timeout: float | None = None, stream: Any = None) -> Work[Any]:
        """Reduce ``x`` (n blocks along axis 0) and keep block ``rank``; by default in x's own block."""
        lane = self._lane
        if lane is not None and stream is None:  # a call of a form the lane knows: done in C (fast_lane.py)
            w = lane.run(_CODES["reduce_scatter"], x, out, op, 0) if timeout is None else False
            if w.__class__ is Work:
                return w
            w = self._by_lane(_CODES["reduce_scatter"], x, out, op, 0, timeout,
                              lambda: self._reduce_scatter(x, op, out, timeout, None), w)
            if w is not None:
                return w
        if self._gpu_lane is not None and stream is None and timeout is None and out is not None:
            return self._via_gpu_lane("reduce_scatter", x, out, op, 0,
                                      lambda: self._reduce_scatter(x, op, out, None, None))
        return self._reduce_scatter(x, op, out, timeout, stream)

    def _reduce_scatter(self, x: Any, op: ReduceOp | str, out: Any, timeout: float | None, stream: Any) -> Work[Any]:
        xb = adapt(x, "x")
        rop = ReduceOp.parse(op)
        check_op_dtype(rop, xb.array.dtype)
        bshape = self._blocks(xb)
        if out is None:
            whole = self._in_place(xb)
            b = bshape[0]
            ob = Buf(whole.array[self.rank * b:(self.rank + 1) * b], True, whole.wrap, immutable=False)
            xb = whole
        else:
            ob = output_like(xb, out, bshape)
            no_foreign_overlap(ob, xb, self.rank, "reduce_scatter")
        count = int(np.prod(bshape))
        return self._collective("reduce_scatter", count, 0, xb, ob, rop, lambda: ob.wrap(ob.array), timeout,
                                stream=stream)

    def gather(self, x: Any, root: int = 0, out: Any = None, *, timeout: float | None = None,
                  stream: Any = None) -> Work[Any]:
        """``all_gather`` onto ``root`` only; other ranks get None."""
        lane = self._lane
        if lane is not None and stream is None:  # a call of a form the lane knows: done in C (fast_lane.py)
            w = lane.run(_CODES["gather"], x, out, None, root) if timeout is None else False
            if w.__class__ is Work:
                return w
            w = self._by_lane(_CODES["gather"], x, out, None, root, timeout,
                              lambda: self._gather(x, root, out, timeout, None), w)
            if w is not None:
                return w
        if self._gpu_lane is not None and stream is None and timeout is None:
            return self._via_gpu_lane("gather", x, out, None, root,
                                      lambda: self._gather(x, root, out, None, None))
        return self._gather(x, root, out, timeout, stream)

    def _gather(self, x: Any, root: int, out: Any, timeout: float | None, stream: Any) -> Work[Any]:
        root = self._root(root)
        xb = adapt(x, "x")
        shape = xb.array.shape
        oshape = (self.world_size * shape[0], *shape[1:]) if shape else (self.world_size,)
        if self.rank == root:
            ob = output_like(xb, out, oshape)
            no_foreign_overlap(xb, ob, root, "gather")
        else:
            ob = xb
        is_root = self.rank == root
        return self._collective("gather", xb.array.size, root, xb, ob, None,
                                lambda: ob.wrap(ob.array) if is_root else None, timeout, stream=stream)

    def scatter(self, x: Any = None, root: int = 0, out: Any = None, *, timeout: float | None = None,
                  stream: Any = None) -> Work[Any]:
        """Root's ``x`` holds n blocks along axis 0; rank i gets block i (in ``out``, or in its own
        ``x``'s block i when every rank passes a full-size ``x``)."""
        lane = self._lane
        if lane is not None and stream is None:  # a call of a form the lane knows: done in C (fast_lane.py)
            w = lane.run(_CODES["scatter"], x, out, None, root) if timeout is None else False
            if w.__class__ is Work:
                return w
            w = self._by_lane(_CODES["scatter"], x, out, None, root, timeout,
                              lambda: self._scatter(x, root, out, timeout, None), w)
            if w is not None:
                return w
        if self._gpu_lane is not None and stream is None and timeout is None:
            return self._via_gpu_lane("scatter", x, out, None, root,
                                      lambda: self._scatter(x, root, out, None, None))
        return self._scatter(x, root, out, timeout, stream)

    def _scatter(self, x: Any, root: int, out: Any, timeout: float | None, stream: Any) -> Work[Any]:
        root = self._root(root)
        if self.rank == root:
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
            ob = Buf(whole.array[self.rank * b:(self.rank + 1) * b], True, whole.wrap)
            xb = ob
        else:
            raise InvalidArgument("scatter: non-root ranks must pass out= (or a full-size x to scatter into)")
        count = ob.array.size
        return self._collective("scatter", count, root, xb, ob, None, lambda: ob.wrap(ob.array), timeout, stream=stream)

    def all_to_all(self, x: Any, out: Any = None, *, timeout: float | None = None,
                  stream: Any = None) -> Work[Any]:
        """Block j of ``x`` goes to rank j; block i of the result came from rank i. In place by default."""
        lane = self._lane
        if lane is not None and stream is None:  # a call of a form the lane knows: done in C (fast_lane.py)
            w = lane.run(_CODES["all_to_all"], x, out, None, 0) if timeout is None else False
            if w.__class__ is Work:
                return w
            w = self._by_lane(_CODES["all_to_all"], x, out, None, 0, timeout,
                              lambda: self._all_to_all(x, out, timeout, None), w)
            if w is not None:
                return w
        if self._gpu_lane is not None and stream is None and timeout is None:
            return self._via_gpu_lane("all_to_all", x, out, None, 0,
                                      lambda: self._all_to_all(x, out, None, None))
        return self._all_to_all(x, out, timeout, stream)

    def _all_to_all(self, x: Any, out: Any, timeout: float | None, stream: Any) -> Work[Any]:
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

    def barrier(self, *, timeout: float | None = None) -> Work[None]:
        """Completes once every rank has entered the barrier."""
        lane = self._lane
        if lane is not None:
            w = lane.run(_BARRIER, None, None, None, 0) if timeout is None else False
            if w.__class__ is Work:
                return w
            w = self._by_lane(_BARRIER, None, None, None, 0, timeout, lambda: self._barrier(timeout), w)
            if w is not None:
                return w
        return self._barrier(timeout)

    def _barrier(self, timeout: float | None) -> Work[None]:
        empty = Buf(np.zeros(0, dtype=np.uint8), True, lambda a: None)
        return self._collective("barrier", 0, 0, empty, empty, None, lambda: None, timeout)
