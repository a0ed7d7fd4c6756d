"""The ``"AIOCCL"`` backend of ``ray.util.collective``: a ``BaseGroup`` whose every op is one aioccl op.

Ray's collective calls block and take their tensors in lists (one per GPU of the process: aioccl takes one).
Each call here starts the op on the group's communicator (its engine on a proxy thread, met through Ray:
``rendezvous.py``) and waits for it, so a call made in an async actor blocks that actor's loop for the op, as
Ray's own backends do, and never deadlocks it: nothing the op needs runs on that loop. The awaitable API that
keeps the loop free is ``aioccl.ray.init_group``.

numpy arrays and torch CPU tensors are reduced and written in place (mixed in one call as the user likes),
cupy arrays on the GPU path. ``timeout_ms`` in an op's options is its deadline; unset, the communicator's
(``AIOCCL_TIMEOUT``). Failures are aioccl's errors as their Ray kinds (``errors.py``: also ``RuntimeError`` s, what
Ray's callers catch): a killed actor's rank is named by ``PeerLost``. A read-only numpy array (Ray's object store
hands actors their arguments so) is written in place with a ``ReadOnlyArrayWarning``, as GLOO writes it.
"""

from __future__ import annotations

import datetime
import os
import sys
import warnings
from types import FrameType
from typing import Any

import numpy as np
from ray.util.collective.backend_registry import _global_registry, register_collective_backend
from ray.util.collective.collective_group.base_collective_group import BaseGroup
from ray.util.collective.types import RecvOptions, ReduceOp, SendOptions

from ..buffers import adapt
from ..errors import InvalidArgument
from .errors import raising_ray_kinds
from .groups import BACKEND, meet_sync

_OPS = {ReduceOp.SUM: "sum", ReduceOp.PRODUCT: "prod", ReduceOp.MIN: "min", ReduceOp.MAX: "max"}


def register() -> None:
    """Register the backend with ``ray.util.collective`` in this process; again is harmless (Ray's registry
    refuses a name twice). ``import aioccl.ray`` calls it: the driver and every actor must, or pass
    ``runtime_env={"worker_process_setup_hook": "aioccl.ray.register"}`` to ``ray.init`` once."""
    if not _global_registry.is_registered(BACKEND):
        register_collective_backend(BACKEND, AiocclGroup)


class AiocclGroup(BaseGroup):
    """One process's member of a ``ray.util.collective`` group, over an aioccl communicator."""

    @raising_ray_kinds
    def __init__(self, world_size: int, rank: int, group_name: str) -> None:
        super().__init__(world_size, rank, group_name)
        self.comm = meet_sync("collective", world_size, rank, group_name, None)

    @classmethod
    def backend(cls) -> str:
        return BACKEND

    @classmethod
    def check_backend_availability(cls) -> bool:
        return True

    @raising_ray_kinds
    def destroy_group(self) -> None:
        """Close the communicator (its peers' later ops fail with ``PeerLost``); the name may be used again."""
        self.comm.close().wait()

    # -- the ops ----------------------------------------------------------------------------------------------
    @raising_ray_kinds
    def allreduce(self, tensors: list[Any], allreduce_options: Any = None) -> None:
        o = allreduce_options
        self.comm.all_reduce(_written(_one(tensors), "allreduce"), _op(o), timeout=_timeout(o)).wait()

    @raising_ray_kinds
    def barrier(self, barrier_options: Any = None) -> None:
        self.comm.barrier(timeout=_timeout(barrier_options)).wait()

    @raising_ray_kinds
    def reduce(self, tensors: list[Any], reduce_options: Any = None) -> None:
        """The result in the root's tensor; the others' are left as they were."""
        o = reduce_options
        root, t = _root(self, o), _one(tensors)
        self.comm.reduce(_written(t, "reduce") if root == self.rank else t, root, _op(o), timeout=_timeout(o)).wait()

    @raising_ray_kinds
    def broadcast(self, tensors: list[Any], broadcast_options: Any = None) -> None:
        o = broadcast_options
        root, t = _root(self, o), _one(tensors)
        self.comm.broadcast(t if root == self.rank else _written(t, "broadcast"), root, timeout=_timeout(o)).wait()

    @raising_ray_kinds
    def allgather(self, tensor_lists: list[list[Any]], tensors: list[Any],
                  allgather_options: Any = None) -> None:
        """Every rank's tensor into ``tensor_lists[0][rank]`` of every rank."""
        x = _flat(_one(tensors), "tensor")
        outs = [_flat(_written(t, "allgather"), f"tensor_list[{i}]") for i, t in enumerate(_list(self, tensor_lists))]
        _alike(outs, x, "allgather")
        whole = self.comm.all_gather(x, timeout=_timeout(allgather_options)).wait()
        for i, out in enumerate(outs):
            out[...] = whole[i * x.size:(i + 1) * x.size]

    @raising_ray_kinds
    def reducescatter(self, tensors: list[Any], tensor_lists: list[list[Any]],
                      reducescatter_options: Any = None) -> None:
        """Reduce ``tensor_lists[0][i]`` over the ranks into rank i's ``tensors[0]``; the inputs stay as they were."""
        out = _flat(_written(_one(tensors), "reducescatter"), "tensor")
        ins = [_flat(t, f"tensor_list[{i}]") for i, t in enumerate(_list(self, tensor_lists))]
        _alike(ins, out, "reducescatter")
        whole = _module(out).empty(len(ins) * out.size, out.dtype)  # (a copy: the inputs stay as they were)
        for i, x in enumerate(ins):
            whole[i * out.size:(i + 1) * out.size] = x
        o = reducescatter_options
        self.comm.reduce_scatter(whole, _op(o), out=out, timeout=_timeout(o)).wait()

    @raising_ray_kinds
    def send(self, tensors: list[Any], send_options: SendOptions) -> None:
        x = _part(_one(tensors), send_options.n_elements)
        self.comm.send(x, _peer(self, send_options.dst_rank), timeout=_timeout(send_options)).wait()

    @raising_ray_kinds
    def recv(self, tensors: list[Any], recv_options: RecvOptions) -> None:
        x = _part(_written(_one(tensors), "recv"), recv_options.n_elements)
        self.comm.recv(x, _peer(self, recv_options.src_rank), timeout=_timeout(recv_options)).wait()


# -- arguments, checked before a byte is sent -------------------------------------------------------------------
class ReadOnlyArrayWarning(UserWarning):
    """A ``ray.util.collective`` call wrote its result into a read-only numpy array's memory."""


def _written(t: Any, what: str) -> Any:
    """The tensor a call writes its result into: itself, or for a read-only numpy array a writable view of the
    same memory, with a warning (once per call site, Python's default for warnings).

    ``ray.util.collective``'s contract is "in place, on the tensor you gave", and Ray hands an actor's numpy
    arguments out of its object store zero-copy and read-only (``actor.set_buffer.remote(np.ones(n))``, kept
    and reduced into later). Ray's GLOO backend writes into them through ``torch.from_numpy``; this backend
    does the same rather than refuse a call Ray's users make every day. The hazard is the object store's:
    every reader of that object (other tasks given the same ``ObjectRef``) sees the result. ``np.array(arg)``
    in the actor keeps the array private (docs/ray.md). aioccl's own API refuses read-only results.
    """
    if not isinstance(t, np.ndarray) or t.flags.writeable:
        return t
    warnings.warn(f"ray.util.collective.{what} writes its result into a read-only numpy array (as Ray's object "
                  "store hands an actor's arguments out: zero-copy, shared with every reader of that object); "
                  "copy it first to keep it private (np.array(arg))", ReadOnlyArrayWarning, stacklevel=_caller())
    return np.asarray(_Writable(t))


class _Writable:
    """A read-only array's memory offered as writable (numpy's array interface with its read-only bit off);
    the view holds this object, which holds the array and so the memory."""

    def __init__(self, a: np.ndarray) -> None:
        self.array = a
        iface = dict(a.__array_interface__)
        iface["data"] = (iface["data"][0], False)
        self.__array_interface__ = iface


_HERE = os.path.dirname(os.path.abspath(__file__))


def _caller() -> int:
    """The ``stacklevel`` of the first frame outside this package and ``ray.util.collective``: the user's call."""
    import ray.util.collective as col

    skip = (_HERE, os.path.dirname(os.path.abspath(col.__file__)))
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and _inside(os.path.abspath(frame.f_code.co_filename), skip):
        frame, level = frame.f_back, level + 1
    return level


def _inside(path: str, folders: tuple[str, ...]) -> bool:
    return any(path.startswith(f + os.sep) for f in folders)


def _one(tensors: Any) -> Any:
    if not isinstance(tensors, (list, tuple)) or len(tensors) != 1:
        n = len(tensors) if isinstance(tensors, (list, tuple)) else "not a list"
        raise InvalidArgument(f"aioccl's Ray backend takes one tensor per process (ray.util.collective passes "
                              f"[tensor]), got {n}: the *_multigpu calls are NCCL's")
    return tensors[0]


def _list(g: AiocclGroup, tensor_lists: Any) -> list[Any]:
    inner = _one(tensor_lists)
    if not isinstance(inner, (list, tuple)) or len(inner) != g.world_size:
        raise InvalidArgument(f"a list of {g.world_size} tensors (one per rank) is needed, got {inner!r:.80}")
    return list(inner)


def _flat(t: Any, name: str) -> Any:
    """A 1-D view of ``t``'s memory: numpy for numpy arrays and CPU tensors, cupy for cupy arrays."""
    if _on_gpu(t):
        if not t.flags.c_contiguous:
            raise InvalidArgument(f"{name} is not C-contiguous")
        return t.reshape(-1)
    return adapt(t, name).array.reshape(-1)


def _on_gpu(t: Any) -> bool:
    return type(t).__module__.startswith("cupy")


def _module(x: Any) -> Any:
    """The array module of a flat view: numpy, or cupy for GPU arrays."""
    if not _on_gpu(x):
        return np
    import cupy

    return cupy


def _alike(xs: list[Any], like: Any, what: str) -> None:
    """Each of a list's tensors (flat views) has ``like``'s size and dtype, in the same memory (host or GPU)."""
    for i, x in enumerate(xs):
        if type(x) is not type(like):
            raise InvalidArgument(f"{what}: tensor_list[{i}] and the tensor are on the host and on the GPU")
        if x.size != like.size or x.dtype != like.dtype:
            raise InvalidArgument(f"{what}: tensor_list[{i}] is {x.size} x {x.dtype}, the tensor {like.size} x "
                                  f"{like.dtype}: they must match")


def _part(t: Any, n: Any) -> Any:
    """``n_elements`` of Ray's send/recv options: the first n (0: all)."""
    if not n:
        return t
    x = _flat(t, "tensor")
    if not isinstance(n, int) or not 0 < n <= x.size:
        raise InvalidArgument(f"n_elements must be in [0, {x.size}], got {n!r}")
    return x[:n]


def _op(o: Any) -> str:
    """Options' ``reduceOp`` (None: Ray's default options, SUM)."""
    op = getattr(o, "reduceOp", ReduceOp.SUM)
    if op not in _OPS:
        raise InvalidArgument(f"reduceOp must be one of {[k.name for k in _OPS]}, got {op!r}")
    return _OPS[op]


def _root(g: AiocclGroup, o: Any) -> int:
    if getattr(o, "root_tensor", 0):
        raise InvalidArgument("root_tensor is for several GPUs per process (NCCL's *_multigpu calls)")
    return _peer(g, getattr(o, "root_rank", 0))


def _peer(g: AiocclGroup, r: Any) -> int:
    if not isinstance(r, int) or not 0 <= r < g.world_size:
        raise InvalidArgument(f"rank {r!r} out of range for the group's {g.world_size} ranks")
    return r


def _timeout(o: Any) -> float | None:
    """An op's ``timeout_ms`` (a timedelta or milliseconds; negative: unset) in seconds."""
    t = getattr(o, "timeout_ms", None)
    if isinstance(t, datetime.timedelta):
        t = t.total_seconds() * 1e3
    return float(t) / 1e3 if isinstance(t, (int, float)) and t > 0 else None
