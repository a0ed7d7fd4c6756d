"""Run one communicator's GPU collectives: the host phase in call order, the data on the GPU.

At call time (the caller's thread) an op takes a ticket and, on the staged
path, enqueues its device-to-host copies on the caller's stream, so it reads
its input right after the work already queued there. Its *host phase* then
runs on the engine's loop when its ticket comes up: tickets run one after
the other, so every rank issues the same host-side messages in the same
order on a private communicator (split off at the first GPU op), whatever
the user does with other ops meanwhile.

Two paths:

* **IPC** (every rank on one host): ranks publish into their CUDA-IPC-shared
  scratch, meet at a barrier, build their outputs from the peers' scratch
  with copies and the reduction kernels, and meet again (``plans.py``).
* **staged** (other hosts, or IPC refused by any rank): pinned host
  buffers, the host engine moves the bytes (and reduces on the CPU), and the
  results are copied back on the caller's stream; elementwise ops go in
  pieces so the copies overlap the transfers.

Either way the Work completes only once the results are *in* the output
buffer: the runner records ``work.event`` on the op's stream right after the
last copy or kernel that writes them and waits (polling, off the loop's
critical path) for it. Completing when they were merely enqueued let a
reader on any other stream (``cp.asnumpy`` on the default stream after an op
with ``stream=``) see the old bytes: the staged path's wrong results on the
first H100 run. Pinned blocks go back to the pool with that event, on
failure too, so none is reused while a queued copy may still touch it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import log
from ..buffers import Buf
from ..dtypes import ReduceOp
from ..envvars import env_int
from ..errors import CollectiveTimeout
from ..kernels import gpu as kernels
from ..work import Work
from . import plans
from .events import wait_event
from .host_phase import host_op
from .ipc import EXPORT_BYTES, Export, IpcState, IpcTable, raw_view, same_call
from .op import GpuOp
from .pinned import PinnedPool
from .probe import load_cupy
from .streams import resolve

if TYPE_CHECKING:
    from ..communicator import Communicator

_log = log.get("GPU")
SCRATCH_DEFAULT = 64 << 20
STAGE_PIECE_DEFAULT = 4 << 20
H2D, D2H = 1, 2  # cudaMemcpyKind


def settings(env: Mapping[str, str]) -> tuple[int, int]:
    """(CUDA-IPC scratch bytes, staged piece bytes) from ``AIOCCL_GPU_SCRATCH`` / ``AIOCCL_GPU_STAGE_PIECE``."""
    return (env_int(env, "AIOCCL_GPU_SCRATCH", SCRATCH_DEFAULT, 4096),
            env_int(env, "AIOCCL_GPU_STAGE_PIECE", STAGE_PIECE_DEFAULT, 4096))


class GpuRunner:
    """Created at a communicator's first op on GPU buffers; see the module docstring."""

    def __init__(self, comm: Communicator) -> None:
        self._cp = load_cupy("GPU buffers")
        self._comm = comm
        # a collective, issued now: every rank does it at the same point (a color: never None)
        self._side: Work[Any] = comm.split(0)
        self._lock = threading.Lock()
        self._tickets = 0
        self._turn = 0
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._skipped: set[int] = set()  # tickets whose op timed out before its turn: passed over
        self._same_host = comm.local_world_size == comm.world_size
        self._ipc: IpcState | None | bool = None  # None: not tried yet; False: refused by some rank
        self._scratch_bytes, self._piece_bytes = settings(os.environ)
        rt = self._cp.cuda.runtime
        self._pinned = PinnedPool(lambda n: rt.hostAlloc(n, 0), rt.freeHost)

    @property
    def path(self) -> str:
        """``"ipc"``, ``"staged"``, or ``"undecided"`` before the first collective's host phase."""
        if isinstance(self._ipc, IpcState):
            return "ipc"
        return "staged" if self._ipc is False or not self._same_host else "undecided"

    # -- call time (caller's thread) ---------------------------------------------------------------
    def prepare(self, name: str, count: int, root: int, inp: Buf, out: Buf, op: ReduceOp | None,
                result: Callable[[], Any], timeout: float, stream: Any) -> tuple[Work[Any], Callable[[], Any]]:
        """A collective: its Work and the engine-side start (the host phase)."""
        g, dev = self._new(name, count, root, inp, out, op, result, timeout, stream)
        if not (self._same_host and self._ipc is not False):
            self._stage_input(g, dev)
        return g.work, lambda: self._run(g, dev)

    def prepare_p2p(self, kind: str, buf: Buf, peer: int, tag: int, result: Callable[[], Any], timeout: float,
                    stream: Any) -> tuple[Work[Any], Callable[[], Any]]:
        """``kind`` "send" or "recv", always staged through pinned host memory."""
        g, dev = self._new(kind, buf.array.size, peer, buf, buf, None, result, timeout, stream)
        g.work.op = f"{kind}(peer={peer}, tag={tag})"
        if kind == "send":
            self._stage_input(g, dev)
        return g.work, lambda: self._run_p2p(g, dev, tag)

    def _new(self, name: str, count: int, root: int, inp: Buf, out: Buf, op: ReduceOp | None,
             result: Callable[[], Any], timeout: float, stream: Any) -> tuple[GpuOp, int]:
        dev = out.device if out.device is not None else inp.device
        assert dev is not None
        if stream is None:  # a torch tensor's own stream, else cupy's current one
            stream = next((b.array.stream for b in (inp, out) if getattr(b.array, "stream", None) is not None), None)
        with self._cp.cuda.Device(dev):
            s = resolve(self._cp, stream)
        with self._lock:
            ticket = self._tickets
            self._tickets += 1
        return GpuOp(name, ticket, count, root, inp, out, op, dev, s, timeout, Work(name, ticket), result), dev

    def _stage_input(self, g: GpuOp, dev: int) -> None:
        """Enqueue the input's device-to-host copies now, in stream order, one event per piece."""
        rank = self._comm.rank
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
                await self._land(g)
            g.work._set_result(g.result())
        except TimeoutError:
            g.work._set_exception(CollectiveTimeout(
                g.work.op, g.seq, waiting(), g.timeout,
                f"GPU op (ticket {g.seq}) not done after {time.monotonic() - t0:.1f}s",
                f"{self._comm._view.ctx:x}"))
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
            await self._wait_turn(g.seq)
            try:
                side = await self._side
                if g.staged_in is None and self._ipc is None:
                    await self._setup_ipc(side, dev, g.timeout)
                if g.staged_in is None and isinstance(self._ipc, IpcState):
                    await self._run_ipc(g, side, dev, self._ipc)
                else:
                    await self._run_staged(g, side, dev)
            finally:
                self._next_turn(g.seq)

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
            await self._wait_turn(g.seq)
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
                self._next_turn(g.seq)
            await host
            if g.name == "recv" and g.out.array.nbytes:
                with self._cp.cuda.Device(dev):
                    self._cp.cuda.runtime.memcpyAsync(g.out.array.ptr, block.ptr, g.out.array.nbytes, H2D,
                                                      g.stream.ptr)

        await self._complete(g, body, lambda: [g.root])

    # -- staged ------------------------------------------------------------------------------------
    async def _run_staged(self, g: GpuOp, side: Communicator, dev: int) -> None:
        if g.staged_in is None:  # meant for IPC, which some rank refused: stage now
            self._stage_input(g, dev)
        assert g.staged_in is not None
        block_in, events = g.staged_in
        rank = self._comm.rank
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

    # -- IPC ---------------------------------------------------------------------------------------
    async def _setup_ipc(self, side: Communicator, dev: int, timeout: float) -> None:
        """Allocate, export and open the scratch buffers; every rank agrees or all fall back to staging."""
        cp, rt = self._cp, self._cp.cuda.runtime
        reason = ""
        own = 0
        export = Export(bytes(64), 0, os.getpid(), dev)
        if os.environ.get("AIOCCL_GPU_IPC", "1") == "0":
            reason = "AIOCCL_GPU_IPC=0"
        else:
            try:
                with cp.cuda.Device(dev):
                    own = rt.malloc(self._scratch_bytes)  # outside cupy's pool: the handle covers just this
                    export = Export(rt.ipcGetMemHandle(own), self._scratch_bytes, os.getpid(), dev)
            except Exception as e:  # noqa: BLE001
                reason = f"cannot export scratch: {e}"
        mine = np.frombuffer(export.encode(), dtype=np.uint8)
        everyone = (await side.all_gather(mine, timeout=timeout)).reshape(side.world_size, EXPORT_BYTES)
        table = IpcTable(side.rank, own, lambda h: rt.ipcOpenMemHandle(h), rt.ipcCloseMemHandle)
        exports = [Export.decode(everyone[r].tobytes()) for r in range(side.world_size)]
        if not reason:
            try:
                with cp.cuda.Device(dev):
                    for r, ex in enumerate(exports):
                        table.add(r, ex)
            except Exception as e:  # noqa: BLE001
                reason = f"cannot open a peer's scratch: {e}"
        agreed = await side.all_reduce(np.array([0 if reason else 1], dtype=np.int32), "min", timeout=timeout)
        if not int(agreed[0]):
            table.close()
            if own:
                rt.free(own)
            self._ipc = False
            _log.warning("GPU ops use staging through host memory: %s", reason or "a peer could not use CUDA IPC")
            return
        cap = min(ex.nbytes for ex in exports)
        with cp.cuda.Device(dev):
            views = [raw_view(cp, table.ptr(r), cap, dev) for r in range(side.world_size)]
        self._ipc = IpcState(table, own, cap, views)
        _log.info("GPU ops use CUDA IPC: %d MiB scratch per rank", cap >> 20)

    async def _run_ipc(self, g: GpuOp, side: Communicator, dev: int, st: IpcState) -> None:
        cp = self._cp
        rank, n = side.rank, side.world_size
        dt = g.out.array.dtype
        sdt = kernels.storage_dtype(dt)
        cap = st.cap_bytes // dt.itemsize
        pieces = plans.ipc_pieces(g.name, rank, n, g.root, g.count, cap)
        inp = g.inp.array.data.reshape(-1)
        out = g.out.array.data.reshape(-1)
        scratches = [v[:cap * dt.itemsize].view(sdt) for v in st.views]
        op = g.op or ReduceOp.SUM
        deadline = g.deadline = time.monotonic() + g.timeout

        def combine(d: Any, a: Any, b: Any) -> None:
            kernels.combine(op, dt, d, a, b)

        def finish(d: Any) -> None:
            kernels.scale(op, dt, d, plans.divisor(g.name, rank, n))

        def launch(fn: Callable[[], None]) -> Any:
            with cp.cuda.Device(dev), g.stream:  # never held across an await: other tasks share this thread
                fn()
                ev = cp.cuda.Event(disable_timing=True)
                ev.record(g.stream)
            return ev

        fp = np.array(g.fp, dtype=np.int64)
        for i, piece in enumerate(pieces):
            await wait_event(launch(functools.partial(plans.publish, piece, inp, scratches[rank], _copy)))
            if i == 0:  # in place of the first barrier: nobody reads a peer's scratch for another call
                await same_call(side, fp, g.work.seq, self._remaining(deadline))
            else:
                await side.barrier(timeout=self._remaining(deadline))
            ev = launch(functools.partial(plans.consume, piece, out, scratches, _copy, combine, finish))
            await wait_event(ev)
            await side.barrier(timeout=self._remaining(deadline))
        if not pieces:
            await same_call(side, fp, g.work.seq, self._remaining(deadline))

    # -- lifetime ----------------------------------------------------------------------------------
    def release(self) -> None:
        """Unmap the peers' scratch and free this rank's (after the last op; errors are logged)."""
        st, self._ipc = self._ipc, False
        if isinstance(st, IpcState):
            for e in st.table.close():
                _log.warning("closing a peer's CUDA IPC mapping failed: %s", e)
            try:
                self._cp.cuda.runtime.free(st.own_ptr)
            except Exception as e:  # noqa: BLE001
                _log.warning("freeing the IPC scratch failed: %s", e)
        self._pinned.close()


def _copy(dst: Any, src: Any) -> None:
    dst[...] = src
