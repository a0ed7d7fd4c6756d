"""Run one communicator's GPU collectives: the host phase in call order, the data on the GPU.

At call time (the caller's thread) an op takes a ticket and, on the staged
path, enqueues its device-to-host copies on the caller's stream, so it reads
its input right after the work already queued there. Its *host phase* then
runs on the engine's loop when its ticket comes up: tickets run one after
the other, so every rank issues the same host-side messages in the same
order on a private communicator (split off at the first GPU op), whatever
the user does with other ops meanwhile.

Two paths:

* **IPC** (every rank on one host): ``device_path.py``. The host only
  enqueues: one kernel per piece on the op's stream, synchronised on the
  device through flags in CUDA-IPC memory, and the Work is complete at
  enqueue, as NCCL's is (``work.event`` marks the results for other
  streams). It is set up once, by the first GPU op; a caller on the engine's
  own thread cannot wait for that, so its first ops take a ticket and are
  enqueued by the engine, in order, once the setup is done.
* **staged** (other hosts, or IPC refused by any rank): pinned host
  buffers, the host engine moves the bytes (and reduces on the CPU), and the
  results are copied back on the caller's stream; elementwise ops go in
  pieces so the copies overlap the transfers. Its Work completes only once
  the results are *in* the output buffer (``work.event`` recorded right after
  the last copy back, and waited for by polling): completing earlier let a
  reader on another stream see the old bytes, the staged path's wrong
  results on the first H100 run. Pinned blocks go back to the pool with that
  event, on failure too, so none is reused while a queued copy may touch it.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .. import log
from ..buffers import Buf
from ..dtypes import ReduceOp
from ..errors import AiocclError, CollectiveTimeout, CommAborted
from ..work import Work
from . import device_setup, plans
from . import lane as native_lane
from .device_path import DevicePath
from .events import wait_event
from .host_phase import host_op
from .op import GpuOp
from .owner import Owner
from .pinned import PinnedPool
from .probe import load_cupy
from .sizes import settings
from .streams import resolve

_log = log.get("GPU")
WATCH_S = 0.02  # how often the engine looks at the device path's error word and deadlines
H2D, D2H = 1, 2  # cudaMemcpyKind


class GpuRunner:
    """Created at a communicator's first op on GPU buffers; see the module docstring."""

    def __init__(self, owner: Owner) -> None:
        self._cp = load_cupy("GPU buffers")
        self._owner = owner
        self._side: Work[Any] = owner.side
        self._lock = threading.Lock()
        self._ops = 0  # every GPU op: its sequence number
        self._tickets = 0  # ops with a host phase (staged, p2p, IPC before the setup): their turn order
        self._turn = 0
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._skipped: set[int] = set()  # tickets whose op timed out before its turn: passed over
        self._same_host = owner.local_world_size == owner.world_size
        self._ipc: DevicePath | None | bool = None  # None: not set up yet; False: refused by some rank
        self._setup_started = False
        self._setup_done = threading.Event()
        self._setup_error: BaseException | None = None
        self._deferred = 0  # IPC ops waiting for the setup on tickets: later ones queue behind them
        self._scratch_bytes, self._piece_bytes = settings(os.environ)
        rt = self._cp.cuda.runtime
        self._pinned = PinnedPool(lambda n: rt.hostAlloc(n, 0), rt.freeHost)

    @property
    def path(self) -> str:
        """``"ipc/spin"``, ``"ipc/stream"`` (``device_path.py``), ``"staged"``, or ``"undecided"`` before the
        setup (the first collective)."""
        if isinstance(self._ipc, DevicePath):
            return f"ipc/{self._ipc.form}"
        return "staged" if self._ipc is False or not self._same_host else "undecided"

    # -- call time (caller's thread) ---------------------------------------------------------------
    def prepare(self, name: str, count: int, root: int, inp: Buf, out: Buf, op: ReduceOp | None,
                result: Callable[[], Any], timeout: float,
                stream: Any) -> tuple[Work[Any], Callable[[], Any] | None]:
        """A collective: its Work and the engine-side start (None: enqueued on the GPU already, Work done)."""
        g, dev = self._new(name, count, root, inp, out, op, result, timeout, stream)
        if self._same_host and self._ipc is not False:
            if not self._setup_done.is_set():  # the first ops only: later ones go straight to the device
                self._start_setup(dev, timeout)
                sync_caller = not self._owner.engine.placement.on_loop_thread()  # its stream order needs it
                if sync_caller and not self._setup_done.wait(timeout):
                    raise CollectiveTimeout(g.work.op, g.seq, [], timeout, "setting up the GPU path")
            if self._setup_error is not None:
                raise self._setup_error
            dp = self._ipc
            if isinstance(dp, DevicePath) and self._deferred == 0:
                dp.enqueue(g)
                if dp.lane is not None and not dp.lane.enabled and dp.failure is None:
                    dp.lane.enabled = True  # every op queued before the setup is on the GPU: calls may skip ahead
                    self._owner.publish_lane(dp.lane)
                return g.work, None
            if dp is None or self._deferred:
                with self._lock:
                    self._deferred += 1
                g.deferred = True
                return self._ticketed(g, lambda: self._run(g, dev))
        self._stage_input(g, dev)
        return self._ticketed(g, lambda: self._run(g, dev))

    def learning(self, code: int, x: Any, out: Any, op: Any, root: int, general: Callable[[], Work[Any]]) -> Work[Any]:
        """A call the device path's lane does not know yet: the general way, after which the lane learns it
        (gpu/lane.py), so the next such call runs in C."""
        w = general()
        dp = self._ipc
        if isinstance(dp, DevicePath) and dp.lane is not None and (
                x.__class__ is self._cp.ndarray or native_lane.takes_tensor(dp.lane, x, dp.dev)):
            native_lane.learn(dp.lane, code, x, out, op, root, w, dp.last)
        return w

    def launched(self, work: Work[Any], code: int) -> tuple[Any, Any]:
        """(the GPU lane, what a caller outside Python launches again for ``work``), or Nones (gpu/lane.py)."""
        return native_lane.launched(self._ipc, work, code)

    def _start_setup(self, dev: int, timeout: float) -> None:
        with self._lock:
            if self._setup_started:
                return
            self._setup_started = True
        self._owner.engine.launch(lambda: self._setup(dev, timeout))

    async def _setup(self, dev: int, timeout: float) -> None:
        """The device path, once, on the engine's loop; its watch runs there for the communicator's life."""
        try:
            side = await self._side
            dp = await device_setup.setup(self._cp, side, dev, self._scratch_bytes, timeout,
                                        self._owner.comm_id)
            if isinstance(dp, str):
                self._ipc = False
                _log.warning("GPU ops use staging through host memory: %s", dp)
            else:
                with self._lock:  # from here on the lane numbers the GPU ops
                    dp.lane = native_lane.make(dp, self._owner, self._ops)
                self._ipc = dp
                self._owner.engine.spawn(self._watch(dp))
        except BaseException as e:
            self._ipc = False
            self._setup_error = e
            if not isinstance(e, Exception):
                raise
        finally:
            self._setup_done.set()

    async def _watch(self, dp: DevicePath) -> None:
        while self._ipc is dp and dp.poll() is None:
            await asyncio.sleep(WATCH_S)

    def prepare_p2p(self, kind: str, buf: Buf, peer: int, tag: int, result: Callable[[], Any], timeout: float,
                    stream: Any) -> tuple[Work[Any], Callable[[], Any]]:
        """``kind`` "send" or "recv", always staged through pinned host memory."""
        g, dev = self._new(kind, buf.array.size, peer, buf, buf, None, result, timeout, stream)
        g.work.op = f"{kind}(peer={peer}, tag={tag})"
        if kind == "send":
            self._stage_input(g, dev)
        return self._ticketed(g, lambda: self._run_p2p(g, dev, tag))

    def _new(self, name: str, count: int, root: int, inp: Buf, out: Buf, op: ReduceOp | None,
             result: Callable[[], Any], timeout: float, stream: Any) -> tuple[GpuOp, int]:
        dev = out.device if out.device is not None else inp.device
        assert dev is not None
        if stream is None:  # a torch tensor's own stream, else cupy's current one
            stream = next((b.array.stream for b in (inp, out) if getattr(b.array, "stream", None) is not None), None)
        with self._cp.cuda.Device(dev):
            s = resolve(self._cp, stream)
        with self._lock:
            dp = self._ipc
            if isinstance(dp, DevicePath) and dp.lane is not None:
                seq = dp.lane.take()
            else:
                seq = self._ops
                self._ops += 1
        return GpuOp(name, seq, count, root, inp, out, op, dev, s, timeout, Work(name, seq), result), dev

    def _ticketed(self, g: GpuOp, start: Callable[[], Any]) -> tuple[Work[Any], Callable[[], Any]]:
        """``g`` runs a host phase: it takes the next turn (call order, the same on every rank)."""
        with self._lock:
            g.ticket = self._tickets
            self._tickets += 1
        return g.work, start

    def _stage_input(self, g: GpuOp, dev: int) -> None:
        """Enqueue the input's device-to-host copies now, in stream order, one event per piece."""
        rank = self._owner.rank
        if not plans.reads_input(g.name, rank, g.root) or g.inp.array.nbytes == 0:
            g.staged_in = (self._pinned.take(max(1, g.inp.array.nbytes)), [])
            g.blocks.append(g.staged_in[0])
            return
        src = g.inp.array
        isz = src.dtype.itemsize
        block = self._pinned.take(src.nbytes)
        g.blocks.append(block)
        events = []
        rt = self._cp.cuda.runtime
        with self._cp.cuda.Device(dev):
            for a, b in plans.stage_pieces(g.name, src.size, max(1, self._piece_bytes // isz)):
                rt.memcpyAsync(block.ptr + a * isz, src.ptr + a * isz, (b - a) * isz, D2H, g.stream.ptr)
                ev = self._cp.cuda.Event(disable_timing=True)
                ev.record(g.stream)
                events.append(ev)
        g.staged_in = (block, events)

    # -- host phase (engine loop) ------------------------------------------------------------------
    async def _complete(self, g: GpuOp, body: Callable[[], Awaitable[None]], waiting: Callable[[], list[int]]) -> None:
        """Run ``body`` within the op's deadline and end its Work: the result, the error, or a
        CollectiveTimeout naming the ranks ``waiting()`` reports."""
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(g.timeout):
                await body()
                if g.work.done():  # enqueued on the device path: complete at enqueue
                    return
                await self._land(g)
            g.work._set_result(g.result())
        except TimeoutError:
            g.work._set_exception(CollectiveTimeout(
                g.work.op, g.seq, waiting(), g.timeout,
                f"GPU op (ticket {g.ticket}) not done after {time.monotonic() - t0:.1f}s",
                self._owner.comm_id))
        except Exception as e:  # noqa: BLE001 - aioccl and CUDA errors alike end on the Work
            g.work._set_exception(e)
        finally:
            if g.blocks:  # failed: back once everything queued on the stream so far (a D2H into them) has run
                self._give_back_blocks(g, self._record(g))

    def _side_waiting(self) -> list[int]:
        side_pending = self._side.result().pending() if self._side.done() and not self._side.exception() else []
        return sorted({r for p in side_pending for r in (p.waiting_for or [])})

    async def _run(self, g: GpuOp, dev: int) -> None:
        async def body() -> None:
            await self._wait_turn(g.ticket)
            try:
                side = await self._side
                while self._same_host and not self._setup_done.is_set():
                    await asyncio.sleep(0.001)
                if self._setup_error is not None:
                    raise self._setup_error
                if g.staged_in is None and isinstance(self._ipc, DevicePath):
                    self._ipc.enqueue(g)
                else:
                    await self._run_staged(g, side, dev)
            finally:
                if g.deferred:
                    with self._lock:
                        self._deferred -= 1
                self._next_turn(g.ticket)

        await self._complete(g, body, self._side_waiting)

    async def _wait_turn(self, ticket: int) -> None:
        if self._turn == ticket:
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters[ticket] = fut
        try:
            await fut
        except BaseException:
            self._skipped.add(ticket)  # its deadline passed first: the ops behind it must not wait for it
            raise
        finally:
            self._waiters.pop(ticket, None)

    def _next_turn(self, ticket: int) -> None:
        turn = ticket + 1
        while turn in self._skipped:
            self._skipped.discard(turn)
            turn += 1
        self._turn = turn
        fut = self._waiters.get(turn)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _remaining(self, deadline: float) -> float:
        return max(0.001, deadline - time.monotonic())

    async def _run_p2p(self, g: GpuOp, dev: int, tag: int) -> None:
        """Post the host send/recv in ticket order, then let the turn go: a send must not hold up the
        receive its peer is waiting for."""

        async def body() -> None:
            await self._wait_turn(g.ticket)
            try:
                side = await self._side
                if g.name == "send":
                    assert g.staged_in is not None
                    block, events = g.staged_in
                    for ev in events:
                        await wait_event(ev)
                    host = side.isend(block.view(g.inp.array.dtype, g.inp.array.size), g.root, tag,
                                      timeout=g.timeout)
                else:
                    block = self._pinned.take(max(1, g.out.array.nbytes))
                    g.blocks.append(block)
                    host = side.irecv(block.view(g.out.array.dtype, g.out.array.size), g.root, tag,
                                      timeout=g.timeout)
            finally:
                self._next_turn(g.ticket)
            await host
            g.work.status = host.status  # a receive from any source or with any tag: whose it got
            if g.name == "recv" and g.out.array.nbytes:
                with self._cp.cuda.Device(dev):
                    self._cp.cuda.runtime.memcpyAsync(g.out.array.ptr, block.ptr, g.out.array.nbytes, H2D,
                                                      g.stream.ptr)

        n, me = self._owner.world_size, self._owner.rank
        await self._complete(g, body, lambda: [g.root] if g.root >= 0 else [r for r in range(n) if r != me])

    # -- staged ------------------------------------------------------------------------------------
    async def _run_staged(self, g: GpuOp, side: Any, dev: int) -> None:
        if g.staged_in is None:  # meant for IPC, which some rank refused: stage now
            self._stage_input(g, dev)
        assert g.staged_in is not None
        block_in, events = g.staged_in
        rank = self._owner.rank
        dt = g.out.array.dtype
        isz = dt.itemsize
        reads = plans.reads_input(g.name, rank, g.root)
        writes = plans.writes_output(g.name, rank, g.root)
        hin = block_in.view(dt, g.inp.array.size)
        hout = hin
        if writes:
            block_out = self._pinned.take(max(1, g.out.array.nbytes))
            g.blocks.append(block_out)
            hout = block_out.view(dt, g.out.array.size)
        rt = self._cp.cuda.runtime
        deadline = time.monotonic() + g.timeout
        pieces = plans.stage_pieces(g.name, g.inp.array.size, max(1, self._piece_bytes // isz))
        for k, (a, b) in enumerate(pieces):
            if reads and events:
                await wait_event(events[k])
            piece = len(pieces) > 1
            await host_op(side, g.name, rank, g.root, g.op, hin[a:b] if piece else hin,
                           hout[a:b] if piece else hout, self._remaining(deadline))
            if writes and g.out.array.nbytes:
                lo, hi = (a, b) if piece else (0, g.out.array.size)
                with self._cp.cuda.Device(dev):
                    rt.memcpyAsync(g.out.array.ptr + lo * isz, hout.ctypes.data + lo * isz, (hi - lo) * isz, H2D,
                                   g.stream.ptr)

    async def _land(self, g: GpuOp) -> None:
        """Wait until the results are in the output buffer; ``work.event`` marks them on the op's stream."""
        ev = self._record(g)
        g.work.event = ev
        self._give_back_blocks(g, ev)  # reused only once ev completed, whatever happens to this op now
        await wait_event(ev)

    def _record(self, g: GpuOp) -> Any:
        with self._cp.cuda.Device(g.device):
            ev = self._cp.cuda.Event(disable_timing=True)
            ev.record(g.stream)
        return ev

    def _give_back_blocks(self, g: GpuOp, ev: Any) -> None:
        for block in g.blocks:
            self._pinned.give_back(block, ev)
        g.blocks = []

    # -- lifetime ----------------------------------------------------------------------------------
    def abort(self, exc: BaseException) -> None:
        """``comm.abort()``: kernels still waiting for peers give up now, stream waits are freed; never blocks."""
        dp = self._ipc
        if isinstance(dp, DevicePath):
            dp.fail(exc if isinstance(exc, AiocclError) else CommAborted(str(exc)))

    def release(self) -> None:
        """Let the device path's queued ops end and free it (after the last op; errors are logged)."""
        dp, self._ipc = self._ipc, False
        self._owner.publish_lane(None)
        if isinstance(dp, DevicePath):
            dp.release()
        self._pinned.close()
