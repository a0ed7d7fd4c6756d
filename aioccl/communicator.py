"""The communicator: the face of a group of ranks, holding its parts and passing them what they need.

Every method checks its arguments in the caller's thread and raises
``InvalidArgument`` *before* anything is sent, then returns a
``Work`` at once. Collectives on one communicator are matched across
ranks by issue order: each call takes the next sequence number, so all ranks
must issue the same collectives in the same order (from any number of tasks
or threads, as long as that order is the same everywhere), exactly as in
NCCL. Point-to-point ops do not take sequence numbers; they match by
(peer, tag) in posting order.

Its parts: the state every part shares (``state.py``), the door and its lanes (``lanes/``), the general
way's collectives and messages (``collectives.py``, ``p2p.py``), the planner (``planning.py``), the
launcher (``launch.py``), the tracker (``tracking.py``) and its lifecycle (``lifecycle.py``). Each public
method is one call of the part that does it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import weakref
from typing import Any, Self

import numpy as np

from . import async_libs, knobs, log, topology
from .algorithms.table import BY_NAME
from .bootstrap.unique_id import UniqueId
from .collectives import GeneralCollectives
from .dtypes import ReduceOp, dtype_code
from .engine.engine import Engine
from .engine.p2p.probes import Message
from .engine.view import CommView
from .envvars import check_timeout, env_int, env_timeout
from .errors import InvalidArgument, PeerLost
from .group import Group
from .introspection import PendingOp
from .lanes.call import RECV, SEND, call_of
from .lanes.cpu import CpuLane
from .lanes.door import Door
from .lanes.general import General
from .lanes.gpu import GpuLane
from .lanes.pair import PairLane
from .launch import Launcher
from .lifecycle import Lifecycle
from .p2p import ANY_SOURCE, ANY_TAG, Messages
from .placement import Placement
from .planning import Planner
from .recovery import on_member_lost
from .state import CommState
from .topology import Topology
from .tracking import Tracker
from .transport.ib.connection import IbConnection
from .transport.shm.pair import ShmPairConnection
from .tuning import Tuning
from .work import Work

_log = log.get("COLL")
_CODES = {c: BY_NAME[c].code for c in BY_NAME}
_ALL_REDUCE, _BARRIER = _CODES["all_reduce"], _CODES["barrier"]
# a shared-memory collective this small, issued from a thread while the proxy engine idles, runs in the call
# (Placement.borrow); a larger one stays on the engine's thread, overlapping the caller's work (DDP's buckets)
DEFAULT_BORROW_BYTES = 64 << 10


class Communicator:
    """A group of ranks that run collectives together.

    Create with [`create`][aioccl.Communicator.create] or [`init()`][aioccl.init].
    """

    _state: CommState  # (what every part shares: state.py)

    def __init__(self, engine: Engine, view: CommView, hosts: list[str], timeout: float, tuning: Tuning,
                 parent: Communicator | None = None, owns_engine: bool | None = None) -> None:
        self._engine = engine
        self._view = view
        self._hosts = hosts
        self._parent = parent
        mine = hosts[view.rank]
        same = [r for r in range(view.size) if hosts[r] == mine]
        self._local = (same.index(view.rank), len(same))
        index: dict[str, int] = {}
        layout = tuple(index.setdefault(h, len(index)) for h in hosts)  # each rank's host, for the tuner
        self._layout = layout
        state = self._state = CommState(view, timeout, parent._state if parent is not None else None)
        # the world's channel is made with the engine; a child's by its lifecycle, before the user sees it
        world = engine.table is not None and view.ctx == engine.table.comm_id
        state.shm = engine.shm if world else None
        self._tracker = tracker = Tracker(engine, state)
        self._cpu = cpu = CpuLane(engine, state, tracker)
        self._planner = planner = Planner(state, tuning, layout, cpu)
        cpu.planner = planner
        self._gpu_lane = gpu_lane = GpuLane(state)
        borrow = env_int(os.environ, "AIOCCL_BORROW_BYTES", DEFAULT_BORROW_BYTES, 0, 1 << 40)
        self._launcher = launcher = Launcher(engine, state, planner, tracker, cpu, gpu_lane, borrow, self._local[1],
                                             lambda: self.split(0))
        self._collectives = collectives = GeneralCollectives(view, launcher)
        self._messages = messages = Messages(engine, state, tracker, launcher)
        # the lanes, tried in lanes/door.py's ORDER; the general way last
        general = General(collectives.run, messages.run)
        gpu_lane.general = general
        if state.shm is not None or view.size == 1:
            cpu.open()
        self._pair = pair = PairLane(engine, state, messages.put_off)
        messages.pair = pair
        self._door = Door({"cpu": cpu, "gpu": gpu_lane, "pair": pair, "general": general})
        self._life = Lifecycle(engine, state, launcher, planner, cpu, self._derive, self.all_gather,
                               parent is None if owns_engine is None else owns_engine)
        if world:  # one listener per engine, for all its communicators
            engine.mailbox.lost_listeners.append(functools.partial(on_member_lost, engine))
        box = engine.mailbox
        gone = next((w for w in view.ranks if w in box.lost and w not in box.closed_peers), None)
        if gone is not None:  # lost while this communicator was being made (its engine's bootstrap)
            state.lose_member(PeerLost(gone, f"{box.lost[gone].detail}; it was rank {view.ranks.index(gone)} of "
                                             f"communicator {view.ctx:x}, so its ops fail until comm.shrink()"))
        engine.watchdog.watch(state)

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
        if self._state.shm is not None:
            return "shm"
        kinds = {self.transport_to(p) for p in range(self.world_size) if p != self.rank}
        return "+".join(sorted(kinds)) if kinds else "tcp"

    def transport_to(self, peer: int) -> str:
        """``"self"``, ``"shm"``, ``"tcp"`` or ``"ib"``: what carries this rank's messages to ``peer``
        (point-to-point always; collectives too unless they run over the shared-memory channel)."""
        peer = self._messages.peer(peer)
        if peer == self.rank:
            return "self"
        conn = self._engine.conns.get(self._view.ranks[peer])
        return "ib" if isinstance(conn, IbConnection) else "shm" if isinstance(conn, ShmPairConnection) else "tcp"

    def topology(self) -> Topology:
        """Hosts, ranks per host, this rank's transport to each peer, and how collectives run
        (see ``aioccl.topology``)."""
        pairs = {p: self._transport_line(p) for p in range(self.world_size) if p != self.rank}
        return topology.of(self.rank, self._layout, self._hosts, self._state.shm is not None, pairs)

    def _transport_line(self, peer: int) -> str:
        kind = self.transport_to(peer)
        stripes = getattr(self._engine.conns.get(self._view.ranks[peer]), "stripes", None)
        return f"{kind}({stripes.parts} streams)" if kind == "tcp" and stripes is not None else kind

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
        self._state.usable()
        shm = self._state.shm
        if shm is None:
            arr = np.zeros(shape_t, dtype=dt)
            port = self._engine.ib_port
            if port is not None and arr.nbytes:  # registered once, for zero-copy RDMA writes
                region = port.register(arr.ctypes.data, arr.nbytes)
                weakref.finalize(arr, port.deregister, region)
            return arr
        arr = shm.alloc(tuple(int(d) for d in shape_t), dt)
        arr[...] = 0
        return arr

    def __repr__(self) -> str:
        return f"<aioccl.Communicator rank {self.rank}/{self.world_size} ctx {self._view.ctx:x}>"

    # -- collectives: each a call of the door (lanes/door.py) --------------------------------------------
    def all_reduce(self, x: Any, op: ReduceOp | str = "sum", out: Any = None, *,
                   timeout: float | None = None, stream: Any = None) -> Work[Any]:
        """Reduce ``x`` across ranks; in place unless ``out`` is given. Awaits to the result."""
        return self._door.collective(_ALL_REDUCE, x, out, op, 0, timeout, stream)


    def scan(self, x: Any, op: ReduceOp | str = "sum", out: Any = None, *,
             timeout: float | None = None, stream: Any = None) -> Work[Any]:
        """Inclusive prefix reduction (``MPI_Scan``): rank r gets ``x_0 op ... op x_r``, folded in rank order;
        ``avg`` divides by r + 1. In place unless ``out`` is given. Awaits to the result."""
        return self._door.collective(_CODES["scan"], x, out, op, 0, timeout, stream)


    def broadcast(self, x: Any, root: int = 0, out: Any = None, *, timeout: float | None = None,
                  stream: Any = None) -> Work[Any]:
        """Copy root's ``x`` into every rank's ``x``, or into ``out`` where given (a new array for JAX)."""
        return self._door.collective(_CODES["broadcast"], x, out, None, root, timeout, stream)


    def reduce(self, x: Any, root: int = 0, op: ReduceOp | str = "sum", out: Any = None, *,
               timeout: float | None = None, stream: Any = None) -> Work[Any]:
        """Reduce onto ``root`` (into ``out`` or, by default, root's ``x``); None on other ranks."""
        return self._door.collective(_CODES["reduce"], x, out, op, root, timeout, stream)


    def all_gather(self, x: Any, out: Any = None, *, timeout: float | None = None,
                  stream: Any = None) -> Work[Any]:
        """Concatenate every rank's ``x`` along axis 0 (0-d inputs give shape ``(n,)``)."""
        return self._door.collective(_CODES["all_gather"], x, out, None, 0, timeout, stream)


    def reduce_scatter(self, x: Any, op: ReduceOp | str = "sum", out: Any = None, *,
                       timeout: float | None = None, stream: Any = None) -> Work[Any]:
        """Reduce ``x`` (n blocks along axis 0) and keep block ``rank``; by default in x's own block."""
        return self._door.collective(_CODES["reduce_scatter"], x, out, op, 0, timeout, stream)


    def gather(self, x: Any, root: int = 0, out: Any = None, *, timeout: float | None = None,
                  stream: Any = None) -> Work[Any]:
        """``all_gather`` onto ``root`` only; other ranks get None."""
        return self._door.collective(_CODES["gather"], x, out, None, root, timeout, stream)


    def scatter(self, x: Any = None, root: int = 0, out: Any = None, *, timeout: float | None = None,
                  stream: Any = None) -> Work[Any]:
        """Root's ``x`` holds n blocks along axis 0; rank i gets block i (in ``out``, or in its own
        ``x``'s block i when every rank passes a full-size ``x``)."""
        return self._door.collective(_CODES["scatter"], x, out, None, root, timeout, stream)


    def all_to_all(self, x: Any, out: Any = None, *, timeout: float | None = None,
                  stream: Any = None) -> Work[Any]:
        """Block j of ``x`` goes to rank j; block i of the result came from rank i. In place by default."""
        return self._door.collective(_CODES["all_to_all"], x, out, None, 0, timeout, stream)


    def barrier(self, *, timeout: float | None = None) -> Work[None]:
        """Completes once every rank has entered the barrier."""
        return self._door.collective(_BARRIER, None, None, None, 0, timeout, None)

    # -- point-to-point -------------------------------------------------------------------------------------
    def isend(self, x: Any, peer: int, tag: int = 0, *, timeout: float | None = None,
              stream: Any = None) -> Work[None]:
        """Send ``x`` to ``peer``; done once the data is handed to the transport.

        A payload over ``AIOCCL_P2P_EAGER`` (1 MiB) goes by rendezvous: it leaves only once ``peer`` has
        posted a matching receive, so the send completes then, and its deadline counts until then. To a
        same-host peer whose FIFO is full, the call waits for room while that peer keeps taking messages
        and the event loop has nothing else to run (its sends would otherwise queue in the engine).
        """
        return self._door.message(SEND, x, peer, tag, timeout, stream)

    def irecv(self, buf: Any, peer: int, tag: int = 0, *, timeout: float | None = None,
              stream: Any = None) -> Work[Any]:
        """Receive into ``buf`` from ``peer``; sizes and dtypes must match the send exactly.

        ``peer=ANY_SOURCE`` and ``tag=ANY_TAG`` match as MPI's: the receive takes the earliest-arrived
        message that fits and that no receive posted before it takes; ``work.status`` (a ``Status``) then
        names its source and tag. From any source, a crashed rank of the communicator fails it.
        """
        return self._door.message(RECV, buf, peer, tag, timeout, stream)

    send = isend
    recv = irecv

    def drain(self, peer: int = ANY_SOURCE, *, timeout: float | None = None) -> Work[None]:
        """Backpressure, as asyncio's ``StreamWriter.drain()``: done once the sends to ``peer`` (default:
        every peer) that wait in the engine, not yet handed to the transport, hold at most
        ``AIOCCL_SEND_QUEUE`` bytes (4 MiB). ``isend`` never waits for its receive; ``await comm.drain(peer)`` after it
        bounds what a sender holds when the peer is slower. Done at once while the peer keeps up; past
        ``timeout`` it raises ``CollectiveTimeout`` naming the peers still behind (the sends run on).
        """
        return self._messages.drain(peer, timeout=timeout)

    def probe(self, peer: int = ANY_SOURCE, tag: int = ANY_TAG, *, timeout: float | None = None) -> Work[Message]:
        """Learn the next message's source, tag, dtype and size without receiving it (MPI's ``Probe``).

        The Work gives a ``Message(source, tag, dtype, size, nbytes)`` for the earliest message waiting
        here that fits ``peer`` and ``tag`` (``ANY_SOURCE`` / ``ANY_TAG``: any), or else the next one to
        arrive that no posted receive takes. The message stays: receive it with
        ``comm.irecv(np.empty(m.size, m.dtype), m.source, m.tag)``. Cancelling the await withdraws the probe.
        """
        return self._messages.probe(peer, tag, timeout=timeout)

    # -- which road -----------------------------------------------------------------------------------------
    def explain(self, op: str, x: Any = None, out: Any = None, *, reduce: Any = "sum", root: int = 0, tag: int = 0,
                timeout: float | None = None, stream: Any = None) -> list[tuple[str, str]]:
        """Which lane would take this call, and why each lane before it would decline, without running it:
        ``comm.explain("all_reduce", x, out=y, timeout=5)`` -> ``[("cpu", "declines: form (...)"), ("gpu",
        "declines: ..."), ("general", "would take it")]``. ``op``: a collective's name, ``"isend"`` or
        ``"irecv"`` (``root`` is then the peer). See docs/troubleshooting.md, "my op is slower than the
        benchmark"."""
        return self._door.explain(call_of(op, x, out, reduce, root, tag, timeout, stream))

    # -- what it is doing ------------------------------------------------------------------------------------
    def pending(self) -> list[PendingOp]:
        """The ops issued on this communicator and not finished yet, oldest first, with the ranks each
        is waiting for (communicator ranks; ``None`` while queued behind earlier ops)."""
        return self._tracker.pending()

    def recent(self) -> list[str]:
        """The flight recorder: the last finished ops (``AIOCCL_FLIGHT_RECORDER`` of them), oldest first."""
        return self._tracker.recent()

    @property
    def _seq(self) -> int:
        """The sequence number the next op takes (how many this communicator has issued)."""
        return self._state.seq

    # -- groups, split, lifetime -------------------------------------------
    def group(self) -> Group:
        """``async with comm.group():`` launches the ops issued inside together and awaits them all."""
        return Group()

    def split(self, color: int | None, key: int | None = None, *,
              timeout: float | None = None) -> Work[Communicator | None]:
        """Collective: ranks with equal ``color`` form a new communicator, ordered by (key, rank).

        ``color=None`` takes part but gets None.
        """
        return self._life.split(color, key, timeout=timeout)

    def create_group(self, ranks: list[int], *, tag: str = "", timeout: float | None = None) -> Work[Communicator]:
        """Collective over ``ranks`` only (MPI's ``MPI_Comm_create_group``): the ranks listed, in that
        order, form a new communicator; the others do not call it.

        Every member passes the same ``ranks`` and ``tag``, and members create their groups in the same
        order (that is how they agree on the new communicator's identity without asking the others).
        Like a ``split`` child it shares this communicator's connections and, on one host, gets a
        shared-memory channel of its own. ``torch.distributed.new_group`` maps to it.
        """
        return self._life.create_group(ranks, tag=tag, timeout=timeout)

    def shrink(self, *, timeout: float | None = None) -> Work[Communicator]:
        """After [`PeerLost`][aioccl.errors.PeerLost]: the survivors agree on who is alive and form a new communicator.

        Every surviving rank calls it (it is collective over the survivors);
        the Work gives the new [`Communicator`][aioccl.Communicator], with ranks renumbered in
        the old order. It reuses the existing connections (so it takes
        milliseconds, not a new bootstrap) and runs over sockets. This
        communicator is then closed and hands the engine to the new one: close
        the new one at the end.
        """
        return self._life.shrink(timeout=timeout)

    def close(self, *, timeout: float | None = None) -> Work[None]:
        """Let in-flight ops finish (for at most ``timeout`` s, default the communicator's), then release
        the communicator, saying goodbye to peers if it owns the connections.

        A receive no message has matched yet is not waited for: it is withdrawn at once and raises
        [`OpCancelled`][aioccl.OpCancelled] (a pipeline's receiver is always waiting when the app shuts
        down). Sends and collectives are promises to peers, so they are let finish.

        Past the deadline the ops still running fail with [`CommAborted`][aioccl.errors.CommAborted], the
        communicator is released anyway, and the returned Work raises
        [`CollectiveTimeout`][aioccl.errors.CollectiveTimeout] naming them.
        """
        return self._life.close(timeout=timeout)

    def abort(self) -> None:
        """Fail every in-flight op with CommAborted now and drop the connections (peers see PeerLost).

        Never blocks (the engine is told, not waited for), is idempotent, and may be called from any
        thread, a signal handler's included, or from a done callback.
        """
        self._life.abort()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            await self.close()
        else:
            self.abort()

    def _derive(self, ranks: list[int], ctx: int, shrunk: bool, owns_engine: bool) -> Communicator:
        """A communicator of ``ranks`` (of this one) on the same engine: a ``split`` child, or the
        survivors after ``shrink`` (which replace this one, so they get its parent, not this one)."""
        view = CommView(ctx, ranks.index(self.rank), len(ranks), tuple(self._view.ranks[r] for r in ranks))
        parent = self._parent if shrunk else (self._parent or self)
        return Communicator(self._engine, view, [self._hosts[r] for r in ranks], self._state.timeout,
                            self._planner.tuning, parent=parent, owns_engine=owns_engine)

    async def _open_channel(self, timeout: float, what: str) -> None:
        """A new child's shared-memory channel, when its ranks share one host (its lifecycle's)."""
        await self._life.open_channel(timeout, what)
