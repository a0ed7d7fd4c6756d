"""The communicator: validate arguments, pick a schedule, hand the op to the engine.

Every method checks its arguments in the caller's thread and raises
``InvalidArgument`` *before* anything is sent, then returns a
``Work`` at once. Collectives on one communicator are matched across
ranks by issue order: each call takes the next sequence number, so all ranks
must issue the same collectives in the same order (from any number of tasks
or threads, as long as that order is the same everywhere), exactly as in
NCCL. Point-to-point ops do not take sequence numbers; they match by
(peer, tag) in posting order.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from . import async_libs, knobs, log, topology
from .algorithms.schedule import Schedule
from .algorithms.table import BY_NAME
from .bootstrap.unique_id import UniqueId
from .buffers import Buf, same_device
from .collectives import CollectiveOps
from .dtypes import ReduceOp, dtype_code
from .engine.engine import Engine
from .engine.op import Op
from .engine.shm import native as shm_native
from .engine.shm.channel import ShmChannel
from .engine.view import CommView
from .envvars import check_timeout, env_int, env_timeout
from .errors import CommAborted, InvalidArgument, PeerLost
from .group import Group
from .introspection import FlightRecorder
from .lanes.call import call_of
from .lanes.cpu import CAPTURE, TEACHING, CpuLane
from .lanes.door import Door
from .lanes.general import General
from .lanes.gpu import GpuLane
from .lanes.pair import PairLane
from .lifecycle import LifecycleOps
from .p2p import PointToPointOps
from .placement import Placement
from .planning import Planning
from .recovery import on_member_lost
from .topology import Topology
from .tracking import OpTracking
from .transport.ib.connection import IbConnection
from .transport.shm.pair import ShmPairConnection
from .tuning import Tuning
from .work import Work

_log = log.get("COLL")
# a shared-memory collective this small, issued from a thread while the proxy engine idles, runs in the call
# (Placement.borrow); a larger one stays on the engine's thread, overlapping the caller's work (DDP's buckets)
DEFAULT_BORROW_BYTES = 64 << 10


class Communicator(CollectiveOps, PointToPointOps, LifecycleOps, OpTracking, Planning):
    """A group of ranks that run collectives together.

    Create with [`create`][aioccl.Communicator.create] or [`init()`][aioccl.init].
    """

    def __init__(self, engine: Engine, view: CommView, hosts: list[str], timeout: float, tuning: Tuning,
                 parent: Communicator | None = None) -> None:
        self._engine = engine
        self._view = view
        self._timeout = timeout
        self._tuning = tuning
        self._parent = parent
        self._lock = threading.Lock()
        self._counters: Any = shm_native.Counters()  # sequence numbers and channel orders; the lane's once made
        # the lanes, tried in lanes/door.py's ORDER; the general way last (this communicator's own methods)
        self._general = General(self._general_collective, self._general_message)
        self._cpu = CpuLane(self)
        self._gpu_lane = GpuLane(self._general)
        self._borrow_bytes = env_int(os.environ, "AIOCCL_BORROW_BYTES", DEFAULT_BORROW_BYTES, 0, 1 << 40)
        # (call) -> its schedule, and that lowered for the native core (None: the Python executor), see _plan
        self._plans: dict[tuple[Any, ...], tuple[Schedule, Any]] = {}
        self._native_max = shm_native.max_bytes()
        self._inflight: set[Work[Any]] = set()
        self._recorder = FlightRecorder()
        self._closed: BaseException | None = None
        self._member_lost: PeerLost | None = None  # a rank of it was lost (not closed): ops fail until shrink
        self._aborted = False
        self._subs: list[Communicator] = []
        self._groups_made: dict[tuple[tuple[int, ...], str], int] = {}  # create_group's per-group serials
        mine = hosts[view.rank]
        same = [r for r in range(view.size) if hosts[r] == mine]
        self._local = (same.index(view.rank), len(same))
        self._hosts = hosts
        index: dict[str, int] = {}
        self._layout = tuple(index.setdefault(h, len(index)) for h in hosts)  # each rank's host, for the tuner
        # the world's channel is made with the engine; a child's by _open_channel, before the user sees it
        world = engine.table is not None and view.ctx == engine.table.comm_id
        self._shm: ShmChannel | None = engine.shm if world else None
        if self._shm is not None or view.size == 1:
            self._cpu.open()
        self._pair = PairLane(engine, view, self._recorder.entries.append, self._put_off)
        self._door = Door({"cpu": self._cpu, "gpu": self._gpu_lane, "pair": self._pair, "general": self._general})
        self._owns_engine = parent is None  # closing it closes the engine (passed on by shrink)
        if world:  # one listener per engine, for all its communicators
            engine.mailbox.lost_listeners.append(functools.partial(on_member_lost, engine))
        self._gpu: Any = None  # GpuRunner, made by the first op on GPU buffers
        box = engine.mailbox
        gone = next((w for w in view.ranks if w in box.lost and w not in box.closed_peers), None)
        if gone is not None:  # lost while this communicator was being made (its engine's bootstrap)
            self._member_lost = PeerLost(gone, f"{box.lost[gone].detail}; it was rank {view.ranks.index(gone)} of "
                                               f"communicator {view.ctx:x}, so its ops fail until comm.shrink()")
            self._lane_off()
        engine.watchdog.watch(self)

    # -- creation ------------------------------------------------------------
    @classmethod
    async def create(cls, uid: Any, rank: int, world_size: int, timeout: float | None = None, *,
                     engine: str = "auto") -> Communicator:
        """Join the communicator named by ``uid`` as ``rank`` of ``world_size``.

        ``engine="inline"`` runs the engine on the calling asyncio loop (lowest latency);
        ``"thread"`` on a private proxy thread (overlaps transfers with blocking work, and is
        how trio programs use aioccl); ``"auto"`` is inline under asyncio, thread under trio.
        """
        lib = async_libs.current()
        if engine == "auto":
            engine = "inline" if lib == "asyncio" else "thread"
        elif engine == "inline" and lib != "asyncio":
            raise InvalidArgument(f"engine='inline' runs on the caller's asyncio loop, but this is {lib}; "
                                  "use engine='thread' (or 'auto')")
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
                eng = await async_libs.wait_future(fut)
            except BaseException:
                placement.stop()
                raise
        return cls._from_engine(eng, timeout)

    @classmethod
    def create_sync(cls, uid: Any, rank: int, world_size: int, timeout: float | None = None) -> Communicator:
        """Blocking flavour of [`create`][aioccl.Communicator.create]; the engine runs on a proxy thread."""
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
        if isinstance(uid, str):
            uid = UniqueId.parse(uid)
        if not isinstance(uid, UniqueId):
            raise InvalidArgument(f"uid must be a UniqueId or its string, got {type(uid).__name__}")
        if not isinstance(world_size, int) or world_size < 1:
            raise InvalidArgument(f"world_size must be a positive int, got {world_size!r}")
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise InvalidArgument(f"rank {rank!r} out of range for world_size {world_size}")
        if engine not in ("inline", "thread"):
            raise InvalidArgument(f"engine must be 'auto', 'inline' or 'thread', got {engine!r}")
        problems = knobs.check(os.environ)  # every knob is checked before anything is sent
        if problems:
            raise InvalidArgument("; ".join(problems))
        timeout = env_timeout(os.environ) if timeout is None else check_timeout(timeout)
        return uid, timeout

    @classmethod
    def _from_engine(cls, eng: Engine, timeout: float) -> Communicator:
        assert eng.table is not None
        hosts = [p["host"] for p in eng.table.peers]
        view = CommView(eng.table.comm_id, eng.rank, eng.size, tuple(range(eng.size)))
        comm = cls(eng, view, hosts, timeout, Tuning.from_env(os.environ))
        _log.info("rank %d/%d ready (engine %s, local %d/%d)", eng.rank, eng.size, eng.placement.kind,
                  *comm._local)
        if _log.isEnabledFor(logging.INFO):
            _log.info("%s", comm.topology().line())
        return comm

    # -- properties ----------------------------------------------------------
    @property
    def rank(self) -> int:
        """This rank's index in the communicator, ``0 .. world_size - 1``."""
        return self._view.rank

    @property
    def world_size(self) -> int:
        """The number of ranks (``size`` is an alias)."""
        return self._view.size

    size = world_size

    @property
    def local_rank(self) -> int:
        """This rank's index among the ranks on its host (by host identity, ``AIOCCL_HOSTID``)."""
        return self._local[0]

    @property
    def local_world_size(self) -> int:
        """The number of ranks on this host."""
        return self._local[1]

    @property
    def engine_placement(self) -> str:
        """Where the engine runs: ``"inline"`` (the caller's loop) or ``"thread"`` (a proxy thread)."""
        return self._engine.placement.kind

    @property
    def transport(self) -> str:
        """``"shm"`` when the collectives run over the shared-memory channel; else how this rank reaches
        its peers: ``"shm"``, ``"tcp"`` or ``"ib"``, or several joined by ``+`` (``"shm+tcp"``) when
        some pairs run over each."""
        if self._shm is not None:
            return "shm"
        kinds = {self.transport_to(p) for p in range(self.world_size) if p != self.rank}
        return "+".join(sorted(kinds)) if kinds else "tcp"

    def transport_to(self, peer: int) -> str:
        """``"self"``, ``"shm"``, ``"tcp"`` or ``"ib"``: what carries this rank's messages to ``peer``
        (point-to-point always; collectives too unless they run over the shared-memory channel)."""
        peer = self._peer(peer)
        if peer == self.rank:
            return "self"
        conn = self._engine.conns.get(self._view.ranks[peer])
        return "ib" if isinstance(conn, IbConnection) else "shm" if isinstance(conn, ShmPairConnection) else "tcp"

    def topology(self) -> Topology:
        """Hosts, ranks per host, this rank's transport to each peer, and how collectives run
        (see ``aioccl.topology``)."""
        return topology.of(self)

    def alloc(self, shape: int | tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
        """A zeroed array in this rank's registered shared memory (like ``ncclMemAlloc``).

        Same-host peers read it where it lies, so collectives on it skip the
        staging copy. Without shared memory (other hosts, ``AIOCCL_SHM_DISABLE``)
        it is an ordinary array, registered with the RDMA port when some peers
        are reached over ib (sends from it are then zero copy), and everything
        still works. Freed when the last view of it is gone; ``MemoryError``
        names ``AIOCCL_SHM_HEAP`` when full.
        """
        shape_t = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        if any(not isinstance(d, (int, np.integer)) or d < 0 for d in shape_t):
            raise InvalidArgument(f"alloc: shape must be non-negative ints, got {shape!r}")
        dt = np.dtype(dtype)
        dtype_code(dt)
        self._usable()
        if self._shm is None:
            arr = np.zeros(shape_t, dtype=dt)
            port = self._engine.ib_port
            if port is not None and arr.nbytes:  # registered once, for zero-copy RDMA writes
                region = port.register(arr.ctypes.data, arr.nbytes)
                weakref.finalize(arr, port.deregister, region)
            return arr
        arr = self._shm.alloc(tuple(int(d) for d in shape_t), dt)
        arr[...] = 0
        return arr

    def __repr__(self) -> str:
        return f"<aioccl.Communicator rank {self.rank}/{self.world_size} ctx {self._view.ctx:x}>"

    # -- plumbing ------------------------------------------------------------
    def _usable(self) -> None:
        if self._closed is not None:
            raise self._closed
        if self._parent is not None and self._parent._closed is not None:
            raise CommAborted(f"parent communicator is closed: {self._parent._closed}")

    def _op_timeout(self, timeout: float | None) -> float:
        return self._timeout if timeout is None else check_timeout(timeout)

    def _root(self, root: int) -> int:
        if not isinstance(root, (int, np.integer)) or not 0 <= root < self.world_size:
            raise InvalidArgument(f"root {root!r} out of range for a communicator of {self.world_size} ranks")
        return int(root)

    def _peer(self, peer: int) -> int:
        if not isinstance(peer, (int, np.integer)) or isinstance(peer, bool):
            raise InvalidArgument(f"peer must be an int (a rank of this communicator, 0..{self.world_size - 1}), "
                                  f"got {peer!r} of type {type(peer).__name__}")
        if not 0 <= peer < self.world_size:
            raise InvalidArgument(f"peer {peer!r} out of range for a communicator of {self.world_size} ranks")
        return int(peer)

    def _collective(self, name: str, count: int, root: int, inp: Buf, out: Buf, op: ReduceOp | None,
                    result: Callable[[], Any], timeout: float | None, in_place: bool = False,
                    stream: Any = None) -> Work[Any]:
        t = self._op_timeout(timeout)
        if not (isinstance(inp.array, np.ndarray) and isinstance(out.array, np.ndarray)):  # GPU, or mixed
            same_device(name, inp, out)  # raises for mixed devices
            self._usable()
            work, start = self._gpu_runner().prepare(name, count, root, inp, out, op, result, t, stream)
            desc = (count, out.array.dtype, op, root if BY_NAME[name].rooted else None)
            if start is None:  # enqueued on the GPU: done, nothing for the engine to do
                work._desc = desc
                work._t0 = time.monotonic()
                self._record(work)
                return work  # type: ignore[no-any-return]
            return self._track(work, desc, start)
        if stream is not None:
            raise InvalidArgument(f"{name}: stream= orders ops on GPU buffers; these buffers are in host memory")
        dt = out.array.dtype
        same = in_place or inp.array is out.array  # peers must not read a buffer this rank overwrites
        plan = self._plans.get((name, count, dt, root, in_place, same)) or self._new_plan(name, count, dt, root,
                                                                                        in_place, same)
        fo = out.array.reshape(-1)
        return self._launch(name, plan[0], fo if inp is out else inp.array.reshape(-1), fo, op, count, root, t, result,
                            plan[1])

    @property
    def _seq(self) -> int:
        """The sequence number the next op takes (how many this communicator has issued)."""
        return int(self._counters.seq)

    def _launch(self, name: str, sched: Schedule, inp: np.ndarray, out: np.ndarray, op: ReduceOp | None,
                count: int, root: int, timeout: float, result: Callable[[], Any], native: Any = None) -> Work[Any]:
        """Run this rank's ``sched`` (any schedule of the one vocabulary) as collective ``name``: on the
        communicator's shared-memory channel, in issue order, when it has lockstep steps, else as a task of
        the engine that awaits its messages."""
        shm = self._shm if sched.lockstep else None
        if sched.lockstep and shm is None:
            raise InvalidArgument(f"{name}: a schedule with shared-memory steps needs ranks on one host")
        dt, coll = out.dtype, BY_NAME[name]
        desc = (count, dt, op, root if coll.rooted else None)
        order = -1  # a channel's op: its issue number there
        lane = self._cpu.native
        if lane is not None and lane.pending:
            self._cpu.adopt_orphan()
        with self._lock:
            self._usable()
            seq, order = self._counters.take(shm is not None)  # the channel runs its ops in issue order
        work: Work[Any] = Work(name, seq)
        op_ = Op(name, coll.code, seq, inp, out, dtype_code(dt) if name != "barrier" else 0, op, count,
                 root, timeout, work, result, sched, order, desc, native)
        work._probe = op_.blocked_on
        if CAPTURE.ops is not None:  # jax_ext learning what a custom call runs (lanes/cpu.py)
            CAPTURE.ops.append((op_, native))  # (the op lets go of its program once it has to wait)
        elif TEACHING.call is not None and native is not None and shm is not None:
            self._cpu.teach(op_, native)  # the lane runs this call's form from now on (lanes/cpu.py)
        _log.debug("%s seq %d: %d x %s, algorithm %s%s", name, seq, count, dt, sched.algo,
                   " over shared memory" if shm is not None else "")
        if shm is not None:  # a small op from another thread may run here, inside the call (placement.py)
            return self._track(work, desc, shm.submit, op_, borrow=0 < self._borrow_bytes >= count * dt.itemsize)
        return self._track(work, desc, self._engine.run_collective, self._view, op_)

    def _gpu_p2p(self, kind: str, buf: Buf, peer: int, tag: int, result: Callable[[], Any], timeout: float,
                 stream: Any) -> Work[Any]:
        work, start = self._gpu_runner().prepare_p2p(kind, buf, peer, tag, result, timeout, stream)
        return self._track(work, (buf.array.size, buf.array.dtype, None, None), start)

    def _gpu_runner(self) -> Any:
        """The GPU path, set up by the first op on GPU buffers (which every rank issues at the same point:
        setting up takes a collective on this communicator)."""
        if self._gpu is None:
            from .gpu.owner import Owner
            from .gpu.runner import GpuRunner  # imports nothing from cupy until here

            # the private group for its host side: a collective, issued now, at the same point on every rank
            side = self.split(0)
            self._gpu = GpuRunner(Owner(self.rank, self.world_size, self.local_world_size, f"{self._view.ctx:x}",
                                        self._engine, side, self._recorder.entries.append, self._publish_gpu_lane))
        return self._gpu

    def _publish_gpu_lane(self, lane: Any) -> None:
        self._gpu_lane.publish(self._gpu, lane)

    def _lane_off(self) -> None:
        """The communicator takes no more ops (closed, aborted, shrunk, a member lost): its lanes say so too,
        for the callers that read only a lane (an XLA custom call, on XLA's thread, without the GIL)."""
        self._cpu.off()
        self._gpu_lane.off()
        self._pair.off()

    def explain(self, op: str, x: Any = None, out: Any = None, *, reduce: Any = "sum", root: int = 0, tag: int = 0,
                timeout: float | None = None, stream: Any = None) -> list[tuple[str, str]]:
        """Which lane would take this call, and why each lane before it would decline, without running it:
        ``comm.explain("all_reduce", x, out=y, timeout=5)`` -> ``[("cpu", "declines: form (...)"), ("gpu",
        "declines: ..."), ("general", "would take it")]``. ``op``: a collective's name, ``"isend"`` or
        ``"irecv"`` (``root`` is then the peer). See docs/troubleshooting.md, "my op is slower than the
        benchmark"."""
        return self._door.explain(call_of(op, x, out, reduce, root, tag, timeout, stream))

    def _derive(self, ranks: list[int], ctx: int, *, shrunk: bool) -> Communicator:
        """A communicator of ``ranks`` (of this one) on the same engine: a ``split`` child, or the
        survivors after ``shrink`` (which replace this one, so they get its parent, not this one)."""
        view = CommView(ctx, ranks.index(self.rank), len(ranks), tuple(self._view.ranks[r] for r in ranks))
        parent = self._parent if shrunk else (self._parent or self)
        return Communicator(self._engine, view, [self._hosts[r] for r in ranks], self._timeout, self._tuning,
                            parent=parent)

    async def _open_channel(self, timeout: float, what: str) -> None:
        """A new child's shared-memory channel, when its ranks share one host (on the engine loop; every
        member calls it at the same point, before any op on the child)."""
        from .engine.shm.setup import setup

        self._shm = await setup(self._engine, self._view, timeout, what)
        self._forget_plans()  # schedules chosen before: sockets
        if self._shm is not None:
            self._cpu.open()

    # -- groups, split, lifetime -------------------------------------------
    def group(self) -> Group:
        """``async with comm.group():`` launches the ops issued inside together and awaits them all."""
        return Group()
