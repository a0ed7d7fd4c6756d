"""The progress engine (NCCL's "proxy"): owns connections, in-flight ops and their deadlines.

All engine state lives on one event loop (see ``.placement``); the
communicator hands it ops from any thread through ``Engine.launch()``.
Each op runs as a task that executes its schedule under its deadline and
completes its ``Work`` with a result or a precise error.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np

from .. import log
from ..bootstrap import mesh
from ..bootstrap.mesh import Table
from ..bootstrap.sockio import Closed
from ..bootstrap.unique_id import UniqueId
from ..errors import AiocclError, CollectiveTimeout, CommAborted, InvalidArgument, PeerLost
from ..placement import Placement
from ..transport.frames import HEADER_SIZE, MISMATCH, NOTICE, PAUSE, PROBE, Header
from ..transport.ib import setup as ib_setup
from ..transport.ib.connection import IbConnection
from ..transport.ib.port import Port
from ..transport.pairing import TRANSPORTS, connect_all, tcp_streams
from ..transport.pairing import hello as streams_hello
from ..transport.shm import pair_setup
from ..transport.shm.pair import PairHub, ShmPairConnection
from ..transport.shm.segment import LoopBell
from ..transport.tcp import LAST_WORDS_S, SelfConnection, TcpConnection, peer_timeout
from ..transport.wiring import Wiring
from ..tuning import Tuning
from ..watchdog import Watchdog, hang_dump_folder, report_unfinished, watchdog_seconds
from . import blame
from .executor import drive, execute
from .mailbox import Mailbox
from .notices import Active, Fingerprint, failure_frame
from .op import Op
from .p2p.backpressure import SendQueue, send_queue_limit
from .p2p.put_off import Waiting
from .p2p.rendezvous import eager_limit, unexpected_budget
from .p2p.starts import net_spin_s
from .pool import BufferPool
from .shm.channel import ShmChannel
from .shm.setup import setup as channel_setup
from .view import CommView

_log = log.get("PROXY")
PROBE_S = 0.2  # a collective still waiting on a peer after this long shows that peer its call (a fingerprint)


def _check_agreement(table: Table) -> None:
    """Settings that decide the schedules must be equal on every rank, or every large collective would
    fail as a mismatch: refuse at creation, on every rank alike, naming the ranks and their values."""
    for name in sorted({k for p in table.peers for k in p.get("agreed", {})}):
        values = [p.get("agreed", {}).get(name) for p in table.peers]
        if len(set(values)) > 1:
            for sock in [*table.conns.values(), *(s for stripe in table.stripes.values() for s in stripe)]:
                sock.close()
            by_value: dict[str, list[int]] = {}
            for r, v in enumerate(values):
                by_value.setdefault(str(v), []).append(r)
            shown = "; ".join(f"ranks {rs} have {v}" for v, rs in by_value.items())
            raise InvalidArgument(f"{name} differs across ranks: {shown}; every rank must use the same value")


class Engine:
    def __init__(self, placement: Placement, rank: int, size: int) -> None:
        self.placement = placement
        self.loop = placement.loop
        self.rank = rank
        self.size = size
        self.pool = BufferPool()
        self.mailbox = Mailbox(self.loop, self.pool, unexpected_budget())
        self.mailbox.budget.pause = self._pause_reading
        self.mailbox.on_pause = self._peer_paused
        self.mailbox.notify = self._notify_mismatch
        self.mailbox.forward = self._forward
        self.mailbox.rdv.send_control = self._control
        self.mailbox.rdv.memory_of = lambda peer: getattr(self.conns.get(peer), "memory", None)
        self.eager = eager_limit()  # larger p2p payloads go by rendezvous
        self.conns: dict[int, TcpConnection | SelfConnection | IbConnection | ShmPairConnection] = {}
        self.pair_hub: PairHub | None = None  # the bell of this rank's shared-memory pairs
        self.queued_sends: dict[int, int] = {}  # per world peer: p2p sends waiting for its connection
        self.put_off: dict[int, Waiting] = {}  # per world peer: sends the lane put off (put_off.py)
        self.send_queue = SendQueue(send_queue_limit())  # their bytes, for comm.drain()
        self.ib_port: Port | None = None  # the opened RDMA port, when some pairs run over ib
        self.table: Table | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.net_spin_s = net_spin_s()  # a p2p receive over TCP polls its socket this long (inline engine)
        self.timers: set[asyncio.TimerHandle] = set()  # deadlines of receives waited for without a task
        self.aborted: BaseException | None = None
        self.shm: ShmChannel | None = None  # the world communicator's, when all ranks share this host
        self.channels: list[ShmChannel] = []  # every communicator's (world and children) on this engine
        self.bell: LoopBell | None = None  # their one doorbell, made with the first
        # collectives running over the connections: (ctx, seq) -> (comm, op, start time)
        self.running: dict[tuple[int, int], tuple[CommView, Op[np.ndarray], float]] = {}
        self._probed: set[tuple[int, int]] = set()
        self._probe_timer: asyncio.TimerHandle | None = None  # one timer for all ops, armed while some run
        self.watchdog = Watchdog(self.loop, watchdog_seconds(os.environ), hang_dump_folder(os.environ),
                                 self._describe_links)

    def _describe_links(self) -> list[str]:
        """The hang dump's view of this rank's transports (watchdog.py): the mailbox's receives posted and
        messages held, and each shared-memory FIFO's words."""
        box = self.mailbox
        posted = {k: len(q) for k, q in box.p2p_posted.items() if q}
        early = {k: len(q) for k, q in box.p2p_early.items() if q}
        lines = [f"mailbox: point-to-point posted {posted} (peer, ctx, tag: count), held {early}, wildcards "
                 f"{bool(box.wild)}, collective frames posted {len(box.posted)} early {len(box.early)}"]
        hub = getattr(self, "pair_hub", None)
        return lines + (hub.describe() if hub is not None else [])

    @classmethod
    async def create(cls, placement: Placement, uid: UniqueId, rank: int, size: int, timeout: float) -> Engine:
        """Bootstrap; must run on ``placement.loop``."""
        self = cls(placement, rank, size)
        liveness = peer_timeout()
        setups = [make() for make in TRANSPORTS]
        hellos = {k: v for row in setups for k, v in row.hello().items()}
        agreed = Tuning.from_env(os.environ).agreed()
        self.table = await mesh.join(uid, rank, size, timeout, {**hellos, "agreed": agreed, **streams_hello()},
                                      tcp_streams(ib_setup.settings().net))
        _check_agreement(self.table)
        wiring = Wiring(self.loop, rank, self.table.comm_id, self.table.conns, self.mailbox, liveness, timeout)
        made = await connect_all(setups, wiring, self.table.peers)
        for row in setups:  # what a row keeps for the engine: ib's port (registered buffers), the pairs' bell
            if isinstance(row, ib_setup.IbSetup) and row.port is not None:
                self._register_pool(row.port)
            elif isinstance(row, pair_setup.PairSetup):
                self.pair_hub = row.hub
                if row.hub is not None:
                    self.mailbox.on_post = row.hub.read_left  # (frames left in a FIFO for the native lane)
        for peer, sock in self.table.conns.items():
            conn = (made.get(peer) or TcpConnection(sock, peer, self.mailbox, liveness, self.table.stripes.get(peer)))
            if isinstance(conn, TcpConnection) and self.placement.kind == "inline":
                conn.share_loop()  # the caller's loop: small pieces, so its timers and tasks wait little
            conn.start()
            self.conns[peer] = conn
        self.conns[rank] = SelfConnection(rank, self.mailbox)
        try:
            self.shm = await channel_setup(self, CommView(self.table.comm_id, rank, size, tuple(range(size))), timeout)
        except BaseException:
            for c in self.conns.values():
                c.abort()
            if self.bell is not None:
                self.bell.close()
            raise
        return self

    def _register_pool(self, port: Port) -> None:
        """ib's port registers the scratch pool's large buffers (an RDMA write lands in them)."""
        self.ib_port = port
        self.pool.on_new = lambda b: port.register(b.ctypes.data, b.nbytes) if b.nbytes >= 1 << 16 else None
        self.pool.on_drop = port.deregister

    # -- shared-memory channels ---------------------------------------------
    def channel_bell(self) -> LoopBell:
        """The doorbell all this engine's channels share (made by the first channel's setup)."""
        if self.bell is None:
            assert self.table is not None
            self.bell = LoopBell(self.loop, self.table.comm_id, self.rank)
            self.bell.start()
        return self.bell

    def attach_channel(self, chan: ShmChannel, view: CommView) -> None:
        """Route lost peers and peers' failure notices to ``chan``; its own failures go to its peers."""
        self.channels.append(chan)
        self.mailbox.lost_listeners.append(chan.on_peer_lost)
        self.mailbox.failure_listeners.append(chan.on_remote_failure)
        chan.report = functools.partial(self.report_failure, view.ctx, view.ranks, view.rank)
        chan.engine, chan.view = self, view

    def detach_channel(self, chan: ShmChannel, exc: BaseException | None = None) -> None:
        """A child communicator is closed or aborted: its channel fails what is queued and unmaps."""
        if chan not in self.channels:
            return
        self.channels.remove(chan)
        self.mailbox.lost_listeners.remove(chan.on_peer_lost)
        self.mailbox.failure_listeners.remove(chan.on_remote_failure)
        if exc is not None:
            chan.fail_all(exc)
        chan.close()

    # -- launching (any thread) ------------------------------------------
    def launch(self, coro_fn: Callable[[], Any]) -> None:
        """Start an op. On the loop's own thread the task is created at once (one loop
        iteration sooner); from other threads it is handed over thread-safely. Either
        way ops from one thread start in the order they were issued."""
        if self.placement.on_loop_thread():
            self._spawn(coro_fn)
        else:
            self.placement.call(self._spawn, coro_fn)

    def _spawn(self, coro_fn: Callable[[], Any]) -> None:
        coro = coro_fn()
        if coro is not None:  # None: a synchronous start (shared-memory ops) that has run already
            self.spawn(coro)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run an op's coroutine as a task of the engine (cancelled on abort); on the engine's thread."""
        task = self.loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # -- data path ---------------------------------------------------------
    async def send(self, peer: int, header: bytes, payload: memoryview | None) -> None:
        lost = self.mailbox.lost.get(peer)
        if lost is not None:
            raise lost
        try:
            await self.conns[peer].send(header, payload)
        except (OSError, Closed) as e:
            raise await self._why_lost(peer) or self.mailbox.peer_lost(peer, f"send failed: {e}") from None

    async def _why_lost(self, peer: int, within: float = 0.1) -> PeerLost | None:
        """A send found its connection ended before the connection's reader did: a moment later the reader has
        the peer's last words (an abort names the rank it had lost first) or the end of the stream, so the
        error says why, as every other op's on this connection does. At most ``within`` seconds."""
        deadline = self.loop.time() + within
        while peer not in self.mailbox.lost and self.loop.time() < deadline and self.aborted is None:
            await asyncio.sleep(0.002)
        return self.mailbox.lost.get(peer)

    async def run_collective(self, comm: CommView, op: Op[np.ndarray]) -> None:
        """Drive ``op``'s executor on a communicator without a shared-memory channel: await what it
        waits for, under the op's deadline."""
        work = op.work
        if not work._start():
            return
        if self.aborted is not None:
            work._set_exception(self.aborted)
            return
        sched = op.sched
        scratch_raw = self.pool.acquire(sched.scratch * op.out.itemsize) if sched.scratch else None
        scratch = (scratch_raw[: sched.scratch * op.out.itemsize].view(op.out.dtype)
                   if scratch_raw is not None else op.out[:0])
        ok = False
        key = (comm.ctx, op.seq)
        err: AiocclError | None = None
        if comm.size > 1:
            self.running[key] = (comm, op, self.loop.time())
            if self._probe_timer is None:
                self._probe_timer = self.loop.call_later(PROBE_S, self._probe_tick)
        op.gen = execute(self, comm, op, scratch)
        try:
            async with asyncio.timeout(op.timeout):
                await drive(op.gen)
            ok = True
            work._set_result(op.result())
        except AiocclError as e:  # first: a CollectiveTimeout told by a peer is a TimeoutError too
            err = e
        except TimeoutError:
            told = op.progress.told()
            err = told if isinstance(told, AiocclError) else \
                CollectiveTimeout(op.name, op.seq, op.progress.waiting_for(), op.timeout, f"algorithm {sched.algo}")
        except asyncio.CancelledError:
            if self.aborted is None:  # its event loop shuts down under it (asyncio.run's end): never awaited
                report_unfinished(work, "its event loop shut down")
            err = self.aborted if isinstance(self.aborted, AiocclError) else \
                CommAborted(f"{op.what(comm.ctx)} was cancelled by shutdown")
            work._set_exception(err)
            raise
        except Exception as e:  # a bug: never leave the Work hanging
            _log.exception("internal error in %s", op.what(comm.ctx))
            err = AiocclError(f"internal error in {op.what(comm.ctx)}: {e!r}")
        finally:
            if self.running.pop(key, None) is not None:
                self._probed.discard(key)
            if err is not None:
                if op.progress.offering:  # a peer may be reading this op's buffers in place: let it finish
                    await op.progress.let_go()
                self.report_failure(comm.ctx, comm.ranks, comm.rank, op.seq, op.fp, err)
                if isinstance(err, CollectiveTimeout) and self.aborted is None:  # name the end of the chain
                    err = await blame.named(err, comm.ranks, self.rank, op.progress.blocked_on(),
                                            lambda: self.mailbox.reports.of(key), self.mailbox.lost)
                work._set_exception(err)
            if ok and scratch_raw is not None:  # a failed op's scratch may still be written by a late frame
                self.pool.release(scratch_raw)

    def _pause_reading(self, peer: int, paused: bool) -> None:
        """Backpressure: stop (or resume) reading ``peer``'s frames; its sender then blocks in the transport."""
        conn = self.conns.get(peer)
        pause = getattr(conn, "pause_reading", None)
        if pause is not None:
            _log.debug("%s reading from rank %d (%d bytes held for receives not posted yet)",
                       "pausing" if paused else "resuming", peer, self.mailbox.budget.held.get(peer, 0))
            pause(paused)
            self._control(peer, Header(PAUSE, 0, 0, 0, 0, int(paused), 0).pack())

    def _peer_paused(self, peer: int, paused: bool) -> None:
        """``peer`` stopped reading from this rank (its budget is spent): our sends to it wait, and its
        closed window must not count as a lost peer until it reads again."""
        conn = self.conns.get(peer)
        hold = getattr(conn, "peer_paused", None)
        if hold is not None:
            hold(paused)

    # -- failure propagation (MPI ULFM's revoke, NCCL's abort) ----------------------------------------
    def _probe_tick(self) -> None:
        """Collectives that have waited PROBE_S show their call to the peers they wait for, once. A peer
        that issued a different one (another root, say, where nobody sends) then reports the mismatch."""
        self._probe_timer = None
        now = self.loop.time()
        for key, (comm, op, t0) in list(self.running.items()):
            if now - t0 < PROBE_S or key in self._probed:
                continue
            self._probed.add(key)
            code, dtype, redop, count, root = op.fp
            frame = Header(PROBE, code, dtype, 0, key[0], key[1], 0, count, root, redop).pack()
            for peer in op.progress.waiting_for():
                world = comm.ranks[peer]
                if world != self.rank and world not in self.mailbox.lost:
                    self._control(world, frame)
        if self.running and self.aborted is None:
            self._probe_timer = self.loop.call_later(PROBE_S, self._probe_tick)

    def report_failure(self, ctx: int, ranks: tuple[int, ...], rank: int, seq: int, fp: Fingerprint,
                       exc: BaseException) -> None:
        """This rank gave up collective ``seq`` of ``ctx`` for ``exc``: tell every other rank of it why,
        so they raise the root cause now instead of waiting for their deadlines. Errors that were
        themselves told to us, and mismatches (which have their own notice), are not passed on."""
        frame = failure_frame(ctx, ranks, rank, seq, fp, exc)
        if frame is None:
            return
        for world in ranks:
            if world != self.rank and world not in self.mailbox.lost:
                self._control(world, frame)

    def _forward(self, ranks: tuple[int, ...], frame: bytes, source: int) -> None:
        """Pass a notice on to the op's other ranks, once: if this rank then aborts, its connections carry
        the root cause ahead of their end, so no peer mistakes the abort for the cause."""
        for world in ranks:
            if world not in (self.rank, source) and world not in self.mailbox.lost:
                self._control(world, frame)

    def _control(self, peer: int, frame: bytes) -> None:
        """A small control frame to ``peer``, sent now if the connection can (synchronously: an abort
        that follows closes the sockets), else as soon as it can."""
        conn = self.conns.get(peer)
        if conn is None or conn.closed:
            return
        if isinstance(conn, (TcpConnection, ShmPairConnection)):
            conn.send_control(frame)
            return

        async def later() -> None:
            try:
                await asyncio.wait_for(self.send(peer, frame[:HEADER_SIZE], memoryview(frame)[HEADER_SIZE:]), 5.0)
            except (AiocclError, TimeoutError):
                pass  # that peer is gone or stuck: its own deadline will fire

        self._spawn(later)

    def _notify_mismatch(self, ctx: int, seq: int, active: Active, offender: int,
                         theirs: tuple[int, int, int, int, int]) -> None:
        """Tell every other rank of the op that ``offender`` issued ``theirs``: they fail it too."""
        payload = memoryview(NOTICE.pack(offender, theirs[0], theirs[1], theirs[2], theirs[3], theirs[4]))
        op, dtype, redop, count, root = active.fp
        # k: this (reporting) world rank + 1, kept when the notice is passed on, so every rank names the two
        # ranks whose calls differ, not the rank that forwarded it (as a FAIL frame's)
        hdr = Header(MISMATCH, op, dtype, self.rank + 1, ctx, seq, len(payload), count, root, redop).pack()
        for peer in active.ranks:
            if peer != self.rank and peer not in self.mailbox.lost:
                self._control(peer, hdr + bytes(payload))

    # -- teardown ------------------------------------------------------------
    async def shutdown(self) -> None:
        """Graceful: say goodbye on every connection and stop the loop thread."""
        self.watchdog.stop()
        if self._probe_timer is not None:
            self._probe_timer.cancel()
            self._probe_timer = None
        for chan in list(self.channels):
            self.detach_channel(chan)
        if self.bell is not None:
            self.bell.close()
        await asyncio.gather(*(c.close(graceful=True) for c in self.conns.values()))
        if self.ib_port is not None:
            self.ib_port.close()
        if self.pair_hub is not None:
            self.pair_hub.close()
        self._cancel_waits()

    def _cancel_waits(self) -> None:
        """Cancel the op tasks and the receive deadlines still pending (at close or abort)."""
        for t in list(self.tasks):
            t.cancel()
        for h in list(self.timers):
            h.cancel()
        self.timers.clear()

    def abort_on_loop(self, exc: BaseException) -> None:
        if self.aborted is None:  # last words: the ops running here are given up, and the peers told why
            for (ctx, seq), (comm, op, _t) in list(self.running.items()):
                self.report_failure(ctx, comm.ranks, comm.rank, seq, op.fp, CommAborted(f"it aborted: {exc}"))
        self.aborted = exc
        self.watchdog.stop()
        if self._probe_timer is not None:
            self._probe_timer.cancel()
            self._probe_timer = None
        for chan in list(self.channels):
            self.detach_channel(chan, exc)
        if self.bell is not None:
            self.bell.close()
        until = time.monotonic() + LAST_WORDS_S  # a half-sent frame is finished first: one budget for all
        for c in self.conns.values():  # (last words naming the rank lost first: the peers blame it, not us)
            c.abort(self.mailbox.lost_first, until)
        if self.ib_port is not None:
            self.ib_port.close()
        if self.pair_hub is not None:
            self.pair_hub.close()
        self.mailbox.fail_all(exc)
        self._cancel_waits()

