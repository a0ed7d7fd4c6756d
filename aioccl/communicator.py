"""The communicator: validate arguments, pick a schedule, hand the op to the engine.

Every method checks its arguments in the caller's thread and raises
:class:`InvalidArgument` *before* anything is sent, then returns a
:class:`Work` at once. Collectives on one communicator are matched across
ranks by issue order: each call takes the next sequence number, so all ranks
must issue the same collectives in the same order (from any number of tasks
or threads, as long as that order is the same everywhere), exactly as in
NCCL. Point-to-point ops do not take sequence numbers; they match by
(peer, tag) in posting order.
"""

from __future__ import annotations

import contextvars
import hashlib
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from . import log
from .algorithms import plan
from .buffers import Buf, adapt, byte_view, check_same, fresh, need_writable, overlaps
from .dtypes import ReduceOp, check_op_dtype, dtype_code
from .engine.engine import CollSpec, CommView, Engine
from .engine.placement import Placement
from .errors import CommAborted, InvalidArgument
from .tuning import Tuning
from .work import Work, completed

_log = log.get("COLL")
DEFAULT_TIMEOUT = 300.0
CODES = {name: i + 1 for i, name in enumerate(
    ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "gather", "scatter", "all_to_all",
     "barrier"))}
MAX_TAG = (1 << 62) - 1

_group: contextvars.ContextVar[list[tuple[Communicator, Callable[[], Any], Work]] | None] = \
    contextvars.ContextVar("aioccl_group", default=None)


def _env_timeout() -> float:
    raw = os.environ.get("AIOCCL_TIMEOUT")
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        raise InvalidArgument(f"AIOCCL_TIMEOUT={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise InvalidArgument("AIOCCL_TIMEOUT must be positive")
    return value


class Communicator:
    """A group of ranks that run collectives together. Create with :meth:`create` or ``aioccl.init()``."""

    def __init__(self, engine: Engine, view: CommView, hosts: list[str], timeout: float, tuning: Tuning,
                 parent: Communicator | None = None) -> None:
        self._engine = engine
        self._view = view
        self._timeout = timeout
        self._tuning = tuning
        self._parent = parent
        self._lock = threading.Lock()
        self._seq = 0
        self._inflight: set[Work] = set()
        self._closed: BaseException | None = None
        self._subs: list[Communicator] = []
        mine = hosts[view.rank]
        same = [r for r in range(view.size) if hosts[r] == mine]
        self._local = (same.index(view.rank), len(same))
        self._hosts = hosts

    # -- creation ------------------------------------------------------------
    @classmethod
    async def create(cls, uid: Any, rank: int, world_size: int, timeout: float | None = None, *,
                     engine: str = "inline") -> Communicator:
        """Join the communicator named by ``uid`` as ``rank`` of ``world_size``.

        ``engine="inline"`` runs the engine on the calling loop; ``"thread"``
        on a private proxy thread (overlaps transfers with blocking work).
        """
        import asyncio

        uid, timeout = cls._check_create(uid, rank, world_size, timeout, engine)
        log.configure_from_env()
        log.set_rank(rank)
        if engine == "inline":
            eng = await Engine.create(Placement.inline(), uid, rank, world_size, timeout)
        else:
            placement = Placement.proxy_thread()
            try:
                fut = asyncio.run_coroutine_threadsafe(
                    Engine.create(placement, uid, rank, world_size, timeout), placement.loop)
                eng = await asyncio.wrap_future(fut)
            except BaseException:
                placement.stop()
                raise
        return cls._from_engine(eng, timeout)

    @classmethod
    def create_sync(cls, uid: Any, rank: int, world_size: int, timeout: float | None = None) -> Communicator:
        """Blocking flavour of :meth:`create`; the engine runs on a proxy thread."""
        import asyncio

        uid, timeout = cls._check_create(uid, rank, world_size, timeout, "thread")
        log.configure_from_env()
        log.set_rank(rank)
        placement = Placement.proxy_thread()
        try:
            eng = asyncio.run_coroutine_threadsafe(
                Engine.create(placement, uid, rank, world_size, timeout), placement.loop).result()
        except BaseException:
            placement.stop()
            raise
        return cls._from_engine(eng, timeout)

    @staticmethod
    def _check_create(uid: Any, rank: int, world_size: int, timeout: float | None,
                      engine: str) -> tuple[Any, float]:
        from .bootstrap.unique_id import UniqueId

        if isinstance(uid, str):
            uid = UniqueId.parse(uid)
        if not isinstance(uid, UniqueId):
            raise InvalidArgument(f"uid must be a UniqueId or its string, got {type(uid).__name__}")
        if not isinstance(world_size, int) or world_size < 1:
            raise InvalidArgument(f"world_size must be a positive int, got {world_size!r}")
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise InvalidArgument(f"rank {rank!r} out of range for world_size {world_size}")
        if engine not in ("inline", "thread"):
            raise InvalidArgument(f"engine must be 'inline' or 'thread', got {engine!r}")
        timeout = _env_timeout() if timeout is None else float(timeout)
        if timeout <= 0:
            raise InvalidArgument("timeout must be positive")
        return uid, timeout

    @classmethod
    def _from_engine(cls, eng: Engine, timeout: float) -> Communicator:
        assert eng.table is not None
        hosts = [p["host"] for p in eng.table.peers]
        view = CommView(eng.table.comm_id, eng.rank, eng.size, tuple(range(eng.size)))
        comm = cls(eng, view, hosts, timeout, Tuning.from_env(os.environ))
        _log.info("rank %d/%d ready (engine %s, local %d/%d)", eng.rank, eng.size, eng.placement.kind,
                  *comm._local)
        return comm

    # -- properties ----------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._view.rank

    @property
    def world_size(self) -> int:
        return self._view.size

    size = world_size

    @property
    def local_rank(self) -> int:
        return self._local[0]

    @property
    def local_world_size(self) -> int:
        return self._local[1]

    @property
    def engine_placement(self) -> str:
        return self._engine.placement.kind

    def __repr__(self) -> str:
        return f"<aioccl.Communicator rank {self.rank}/{self.world_size} ctx {self._view.ctx:x}>"

    # -- plumbing ------------------------------------------------------------
    def _usable(self) -> None:
        if self._closed is not None:
            raise self._closed
        if self._parent is not None and self._parent._closed is not None:
            raise CommAborted(f"parent communicator is closed: {self._parent._closed}")

    def _op_timeout(self, timeout: float | None) -> float:
        if timeout is None:
            return self._timeout
        if timeout <= 0:
            raise InvalidArgument("timeout must be positive")
        return float(timeout)

    def _root(self, root: int) -> int:
        if not isinstance(root, (int, np.integer)) or not 0 <= root < self.world_size:
            raise InvalidArgument(f"root {root!r} out of range for a communicator of {self.world_size} ranks")
        return int(root)

    def _peer(self, peer: int) -> int:
        if not isinstance(peer, (int, np.integer)) or not 0 <= peer < self.world_size:
            raise InvalidArgument(f"peer {peer!r} out of range for a communicator of {self.world_size} ranks")
        return int(peer)

    def _track(self, work: Work, start: Callable[[], Any]) -> Work:
        work._engine_thread = self._engine.placement.thread_id  # wait() there would deadlock
        self._inflight.add(work)
        work.add_done_callback(self._inflight.discard)
        pending = _group.get()
        if pending is not None:
            pending.append((self, start, work))
        else:
            self._engine.launch(start)
        return work

    def _collective(self, name: str, count: int, root: int, inp: Buf, out: Buf, op: ReduceOp | None,
                    result: Callable[[], Any], timeout: float | None, in_place: bool = False) -> Work:
        t = self._op_timeout(timeout)
        dt = out.array.dtype
        nbytes = count * dt.itemsize
        algo, chunk = self._tuning.choose(name, nbytes, dt.itemsize)
        with self._lock:
            self._usable()
            seq = self._seq
            self._seq += 1
        sched = plan(name, count, self.rank, self.world_size, root, chunk, algo, in_place)
        spec = CollSpec(name, CODES[name], seq, sched, inp.flat, out.flat,
                        dtype_code(dt) if name != "barrier" else 0, op, t, result)
        work = Work(name, seq)
        view, eng = self._view, self._engine
        _log.debug("%s seq %d: %d x %s, algo %s, chunk %d", name, seq, count, dt.name, algo, chunk)
        return self._track(work, lambda: eng.run_collective(view, spec, work))

    @staticmethod
    def _output_like(x: Buf, out: Any, shape: tuple[int, ...], name: str = "out") -> Buf:
        if out is None:
            return fresh(shape, x)
        ob = adapt(out, name)
        need_writable(ob, name)
        check_same(x, ob, name, shape)
        return ob

    @staticmethod
    def _in_place(x: Buf, name: str = "x") -> Buf:
        """The buffer an in-place op writes: ``x`` itself, or a fresh copy for immutable (JAX) arrays."""
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
                   timeout: float | None = None) -> Work:
        """Reduce ``x`` across ranks; in place unless ``out`` is given. Awaits to the result."""
        xb = adapt(x, "x")
        rop = ReduceOp.parse(op)
        check_op_dtype(rop, xb.array.dtype)
        ob = self._in_place(xb) if out is None else self._output_like(xb, out, xb.array.shape)
        if out is not None and ob.array is not xb.array and overlaps(ob.array, xb.array):
            raise InvalidArgument("out partially overlaps x; pass the same array for in place, or disjoint memory")
        inp = ob if (out is None and xb.immutable) else xb
        return self._collective("all_reduce", xb.array.size, 0, inp, ob, rop, lambda: ob.wrap(ob.array), timeout)

    def broadcast(self, x: Any, root: int = 0, *, timeout: float | None = None) -> Work:
        """Copy root's ``x`` into every rank's ``x`` (in place; a new array for JAX inputs)."""
        root = self._root(root)
        xb = adapt(x, "x")
        ob = xb if (self.rank == root and not xb.immutable) else self._in_place(xb)
        return self._collective("broadcast", xb.array.size, root, ob, ob, None, lambda: ob.wrap(ob.array), timeout)

    def reduce(self, x: Any, root: int = 0, op: ReduceOp | str = "sum", out: Any = None, *,
               timeout: float | None = None) -> Work:
        """Reduce onto ``root`` (into ``out`` or, by default, root's ``x``); None on other ranks."""
        root = self._root(root)
        xb = adapt(x, "x")
        rop = ReduceOp.parse(op)
        check_op_dtype(rop, xb.array.dtype)
        if out is not None:
            ob = self._output_like(xb, out, xb.array.shape)
        elif self.rank == root:
            ob = self._in_place(xb)
        else:
            ob = xb  # never written on non-root ranks
        is_root = self.rank == root
        inp = ob if (out is None and xb.immutable and is_root) else xb
        return self._collective("reduce", xb.array.size, root, inp, ob, rop,
                                lambda: ob.wrap(ob.array) if is_root else None, timeout)

    def all_gather(self, x: Any, out: Any = None, *, timeout: float | None = None) -> Work:
        """Concatenate every rank's ``x`` along axis 0 (0-d inputs give shape ``(n,)``)."""
        xb = adapt(x, "x")
        shape = xb.array.shape
        oshape = (self.world_size * shape[0], *shape[1:]) if shape else (self.world_size,)
        ob = self._output_like(xb, out, oshape)
        self._no_foreign_overlap(xb, ob, self.rank)
        return self._collective("all_gather", xb.array.size, 0, xb, ob, None, lambda: ob.wrap(ob.array), timeout)

    def reduce_scatter(self, x: Any, op: ReduceOp | str = "sum", out: Any = None, *,
                       timeout: float | None = None) -> Work:
        """Reduce ``x`` (n blocks along axis 0) and keep block ``rank``; by default in x's own block."""
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
            ob = self._output_like(xb, out, bshape)
            self._no_foreign_overlap(ob, xb, self.rank)
        count = int(np.prod(bshape))
        return self._collective("reduce_scatter", count, 0, xb, ob, rop, lambda: ob.wrap(ob.array), timeout)

    def gather(self, x: Any, root: int = 0, out: Any = None, *, timeout: float | None = None) -> Work:
        """``all_gather`` onto ``root`` only; other ranks get None."""
        root = self._root(root)
        xb = adapt(x, "x")
        shape = xb.array.shape
        oshape = (self.world_size * shape[0], *shape[1:]) if shape else (self.world_size,)
        if self.rank == root:
            ob = self._output_like(xb, out, oshape)
            self._no_foreign_overlap(xb, ob, root)
        else:
            ob = xb
        is_root = self.rank == root
        return self._collective("gather", xb.array.size, root, xb, ob, None,
                                lambda: ob.wrap(ob.array) if is_root else None, timeout)

    def scatter(self, x: Any = None, root: int = 0, out: Any = None, *, timeout: float | None = None) -> Work:
        """Root's ``x`` holds n blocks along axis 0; rank i gets block i (in ``out``, or in its own
        ``x``'s block i when every rank passes a full-size ``x``)."""
        root = self._root(root)
        if self.rank == root:
            xb = adapt(x, "x")
            bshape = self._blocks(xb)
            b = bshape[0]
            if out is None:
                ob = Buf(xb.array[root * b:(root + 1) * b], xb.writable, xb.wrap, immutable=xb.immutable)
            else:
                ob = self._output_like(xb, out, bshape)
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
        return self._collective("scatter", count, root, xb, ob, None, lambda: ob.wrap(ob.array), timeout)

    def all_to_all(self, x: Any, out: Any = None, *, timeout: float | None = None) -> Work:
        """Block j of ``x`` goes to rank j; block i of the result came from rank i. In place by default."""
        xb = adapt(x, "x")
        bshape = self._blocks(xb)
        if out is None:
            ob = self._in_place(xb)
            in_place = True
        else:
            ob = self._output_like(xb, out, xb.array.shape)
            if overlaps(ob.array, xb.array):
                raise InvalidArgument("all_to_all: out overlaps x; omit out= for in place")
            in_place = False
        count = int(np.prod(bshape))
        inp = ob if in_place else xb
        return self._collective("all_to_all", count, 0, inp, ob, None, lambda: ob.wrap(ob.array), timeout,
                                in_place=in_place)

    def barrier(self, *, timeout: float | None = None) -> Work:
        """Completes once every rank has entered the barrier."""
        empty = Buf(np.zeros(0, dtype=np.uint8), True, lambda a: None)
        return self._collective("barrier", 0, 0, empty, empty, None, lambda: None, timeout)

    def _no_foreign_overlap(self, small: Buf, big: Buf, block: int) -> None:
        """``small`` may be exactly ``big``'s block ``block`` (NCCL-style in place), nothing else."""
        if not overlaps(small.array, big.array):
            return
        n = small.array.size
        exact = big.array.reshape(-1)[block * n:(block + 1) * n]
        if small.array.reshape(-1).__array_interface__["data"][0] != exact.__array_interface__["data"][0]:
            raise InvalidArgument("input and output overlap other than at this rank's own block")

    # -- point to point ------------------------------------------------------
    def _tag(self, tag: int) -> int:
        if not isinstance(tag, (int, np.integer)) or not 0 <= tag <= MAX_TAG:
            raise InvalidArgument(f"tag must be an int in [0, 2**62), got {tag!r}")
        return int(tag)

    def isend(self, x: Any, peer: int, tag: int = 0, *, timeout: float | None = None) -> Work:
        """Send ``x`` to ``peer``; done once the data is handed to the transport."""
        peer, tag = self._peer(peer), self._tag(tag)
        xb = adapt(x, "x")
        t = self._op_timeout(timeout)
        self._usable()
        work = Work(f"send(peer={peer}, tag={tag})", tag, cancellable=True)
        view, eng, code = self._view, self._engine, dtype_code(xb.array.dtype)
        payload = byte_view(xb.array)
        return self._track(work, lambda: eng.run_send(view, peer, tag, payload, code, t, work, None))

    send = isend

    def irecv(self, buf: Any, peer: int, tag: int = 0, *, timeout: float | None = None) -> Work:
        """Receive into ``buf`` from ``peer``; sizes and dtypes must match the send exactly."""
        peer, tag = self._peer(peer), self._tag(tag)
        bb = adapt(buf, "buf")
        need_writable(bb, "buf")
        t = self._op_timeout(timeout)
        self._usable()
        work = Work(f"recv(peer={peer}, tag={tag})", tag, cancellable=True)
        view, eng, code = self._view, self._engine, dtype_code(bb.array.dtype)
        target = byte_view(bb.array)
        return self._track(work, lambda: eng.run_recv(view, peer, tag, target, code, t, work,
                                                       bb.wrap(bb.array)))

    recv = irecv

    # -- groups, split, lifetime -------------------------------------------
    def group(self) -> Group:
        """``async with comm.group():`` launches the ops issued inside together and awaits them all."""
        return Group()

    def split(self, color: int | None, key: int | None = None, *, timeout: float | None = None) -> Work:
        """Collective: ranks with equal ``color`` form a new communicator, ordered by (key, rank).

        ``color=None`` takes part but gets None.
        """
        if color is not None and (not isinstance(color, (int, np.integer)) or color < 0):
            raise InvalidArgument(f"color must be a non-negative int or None, got {color!r}")
        if key is not None and not isinstance(key, (int, np.integer)):
            raise InvalidArgument(f"key must be an int or None, got {key!r}")
        mine = np.array([-1 if color is None else color, self.rank if key is None else key], dtype=np.int64)
        gathered = self.all_gather(mine, timeout=timeout)
        result = Work("split", gathered.seq)

        def finish(w: Work) -> None:
            exc = w.exception()
            if exc is not None:
                result._set_exception(exc)
                return
            if color is None:
                result._set_result(None)
                return
            table = w.result().reshape(self.world_size, 2)
            members = sorted((int(table[r, 1]), r) for r in range(self.world_size) if table[r, 0] == color)
            ranks = [r for _, r in members]
            digest = hashlib.blake2b(f"{self._view.ctx}:{w.seq}:{color}".encode(), digest_size=8).digest()
            ctx = int.from_bytes(digest, "little") >> 1
            view = CommView(ctx, ranks.index(self.rank), len(ranks), tuple(self._view.ranks[r] for r in ranks))
            sub = Communicator(self._engine, view, [self._hosts[r] for r in ranks], self._timeout,
                               self._tuning, parent=self._parent or self)
            self._subs.append(sub)
            result._set_result(sub)

        gathered.add_done_callback(finish)
        return result

    def close(self) -> Work:
        """Finish in-flight ops, then release the communicator (say goodbye to peers if it owns them)."""
        with self._lock:
            if self._closed is not None:
                return completed("close", -1, None)
            self._closed = CommAborted(f"{self!r} is closed")
        pending = list(self._inflight)
        work = Work("close", -1)
        owns = self._parent is None
        eng = self._engine

        async def run() -> None:
            for w in pending:
                try:
                    await w
                except BaseException:  # noqa: BLE001 - close reports nothing about earlier ops
                    pass
            if owns:
                await eng.shutdown()
            work._set_result(None)
            if owns:
                eng.placement.stop()

        if eng.loop.is_closed():
            work._set_result(None)
        else:
            eng.launch(run)
        return work

    def abort(self) -> None:
        """Fail every in-flight op with CommAborted now and drop the connections (peers see PeerLost)."""
        exc = CommAborted(f"{self!r} was aborted")
        with self._lock:
            self._closed = exc
        for w in list(self._inflight):
            w._set_exception(exc)
        if self._parent is None:
            eng = self._engine
            if eng.placement.on_loop_thread():
                eng.abort_on_loop(exc)
            elif not eng.loop.is_closed():
                eng.placement.call(eng.abort_on_loop, exc)
            eng.placement.stop()

    async def __aenter__(self) -> Communicator:
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            await self.close()
        else:
            self.abort()


class Group:
    """Batches ops (like ``ncclGroupStart/End``): launched together at exit, which awaits them all.

    The batch is per task (a context variable), so concurrent tasks never
    capture each other's ops. Nested groups join the outermost one.
    """

    def __init__(self) -> None:
        self._token: contextvars.Token[Any] | None = None
        self._ops: list[tuple[Communicator, Callable[[], Any], Work]] = []

    def _enter(self) -> None:
        if _group.get() is None:
            self._token = _group.set(self._ops)

    def _launch(self) -> list[Work]:
        if self._token is None:
            return []
        _group.reset(self._token)
        for comm, start, _w in self._ops:
            comm._engine.launch(start)
        return [w for _c, _s, w in self._ops]

    async def __aenter__(self) -> Group:
        self._enter()
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        works = self._launch()
        first: BaseException | None = None
        for w in works:
            try:
                await w
            except Exception as e:  # noqa: BLE001 - re-raised below
                first = first or e
        if first is not None and exc_type is None:
            raise first

    def __enter__(self) -> Group:
        self._enter()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        works = self._launch()
        first: BaseException | None = None
        for w in works:
            try:
                w.wait()
            except Exception as e:  # noqa: BLE001 - re-raised below
                first = first or e
        if first is not None and exc_type is None:
            raise first
