"""Collectives on one host's GPUs with the host only enqueueing: one kernel per piece, flags on the device.

Set up once per communicator (``setup``): every rank's scratch (a header of
flag words and fingerprints, then two data halves) shared through CUDA IPC,
the table of the ranks' scratch addresses on the device, and an error word
in host-mapped memory. An op then costs the caller's thread one kernel
launch per piece on the op's stream (``enqueue``), and its Work is complete
at once, as NCCL's is: later work on that stream sees the results,
``work.event`` marks them for other streams. No host thread waits on the
GPU and the engine is not on the op's path.

Two forms, chosen at setup by measuring a hand-off between the ranks:

* **spin**: the ranks' kernels run at the same time (MPS, or one process
  per GPU), so a kernel publishes its flag and spins on its peers' (about a
  microsecond a hand-off);
* **stream**: the processes are time-sliced on one GPU, where a spinning
  kernel waits a whole time slice for its peer; the host puts
  ``cuStreamWriteValue32`` / ``cuStreamWaitValue32`` between a publish and
  a consume launch instead, and the GPU waits without running anything.

A kernel that waits past the op's deadline, or sees another rank's call
(fingerprints differ), gives up and writes the error word; ``poll`` (the
engine's loop, every few ms) turns it into ``CollectiveTimeout`` or
``CollectiveMismatch``, which the communicator's next GPU op raises. The
same watch catches a stream form op whose event stays pending past its
deadline, and frees the stream by writing the flags it waits on.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import log
from ..algorithms.table import name_of
from ..dtypes import ReduceOp
from ..engine.notices import describe_call
from ..errors import AiocclError, CollectiveMismatch, CollectiveTimeout, CommAborted, InvalidArgument
from ..kernels import gpu_piece as K
from . import lane as native_lane
from . import plans, streamops
from .ipc import IpcTable
from .launch import Launch
from .op import GpuOp
from .piece import Piece, fingerprint, lower, unpack_fingerprint

_log = log.get("GPU")
H2D, D2H = 1, 2
SPIN_GRID_RANKS = 128  # spin-form blocks, all ranks together: every rank's blocks must be resident at once
MAX_GRID = 264  # stream form: no block waits on another rank, so fill the GPU (132 SMs on an H100)
EPOCH_ARG = 19  # where the epoch is in the kernel's arguments (``args``)
TRACKED = 1024  # ops in flight per communicator; the caller waits for the oldest beyond this


@dataclass
class _Tracked:
    event: Any
    seq: int
    name: str
    deadline: float
    epoch: int
    timeout: float
    keep: Any  # the op's buffers: alive until its kernels ran (a freed input could be reused under them)


class DevicePath:
    """One communicator's device-synchronised CUDA-IPC collectives; see the module docstring."""

    def __init__(self, cp: Any, rank: int, nranks: int, dev: int, table: IpcTable, own: int, half_bytes: int,
                 bases: Any, err_ptr: int, comm_id: str, small_bytes: int = 0) -> None:
        self.cp, self.rank, self.nranks, self.dev = cp, rank, nranks, dev
        self._table, self.own, self.half_bytes = table, own, half_bytes
        self._bases = bases  # device array: rank -> its scratch as mapped here
        self._bases_ptr = np.uint64(bases.data.ptr)
        self._err_ptr = err_ptr
        self.err = np.frombuffer(memoryview((ctypes.c_char * 16).from_address(err_ptr)).cast("B"), dtype=np.uint32)
        self._comm_id = comm_id
        self.form, self.why = "spin", ""
        # every spin-form launch has this many blocks (the epoch's parity must agree in all of them), and the
        # ranks' blocks together stay well inside what one H100 holds at once (132 SMs x 3 such blocks)
        self.spin_grid = max(4, min(K.FLAG_WORDS, SPIN_GRID_RANKS // nranks))
        # an all_reduce of at most this many bytes runs the one-block small kernel (spin form only: its lines
        # are polled by kernels running at once; kernels/gpu_small.cu)
        self.small_bytes = min(small_bytes, K.SMALL_MAX_BYTES)
        self._epoch = 0  # this rank's count of pieces, as the device counts them (without graph replays)
        self.lane: Any = None  # the native GPU lane (gpu/lane.py), which then launches every op
        self.last: tuple[int, Any, int, float] | None = None  # the lane's last op: (seq, plan, stream, timeout)
        self._plans: dict[tuple[Any, ...], Any] = {}
        self._lock = threading.Lock()
        self._modules: dict[str, Any] = {}
        self._functions: dict[str, Any] = {}
        self._launch_cache: dict[tuple[Any, ...], list[tuple[Launch, Launch | None]]] = {}
        self._pieces: dict[tuple[Any, ...], list[Piece]] = {}
        self._recent: OrderedDict[int, tuple[str, int, float]] = OrderedDict()  # epoch -> (op, seq, timeout)
        self._tracked: deque[_Tracked] = deque()
        self._last_stream: Any = None
        self._side_stream: Any = None
        self._write, self._wait = streamops.load(cp)
        self.failure: AiocclError | None = None

    @property
    def epoch(self) -> int:
        return int(self.lane.epoch) if self.lane is not None else self._epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self._epoch = value

    @property
    def err_ptr(self) -> int:
        return self._err_ptr

    def flag_ptr(self, rank: int) -> int:
        """Rank ``rank``'s flag word (the start of its scratch) as mapped in this process."""
        return self._table.ptr(rank)

    # -- enqueue (the caller's thread) -------------------------------------------------------------
    def kernel(self, dt: np.dtype, op: ReduceOp | None, small: bool = False) -> Any:
        name = K.small_kernel_name(op, dt) if small else K.kernel_name(op, dt)
        fn = self._functions.get(name)
        if fn is None:
            mod = self._modules.get(dt.name)
            if mod is None:
                with self.cp.cuda.Device(self.dev):
                    mod = self._modules[dt.name] = self.cp.RawModule(code=K.module_source(dt),
                                                                       options=("-std=c++17",))
            fn = self._functions[name] = mod.get_function(name)
        return fn

    def args(self, in_ptr: int, out_ptr: int, count: int, p: Piece, fp: int, timeout: float, phase: int,
             kind: int) -> tuple[Any, ...]:
        """The kernel's arguments; the epoch (``EPOCH_ARG``) is 0, which the spin form derives on the device
        and the stream form's ``Launch`` sets per launch."""
        return (self._bases_ptr, np.uint64(in_ptr), np.uint64(out_ptr), np.uint64(self._err_ptr),
                np.int64(count), np.int64(p.a), np.int64(p.n), np.int64(self.half_bytes),
                np.int64(min(timeout, 1e9) * 1e9), np.uint64(fp), np.float64(p.divisor), np.int32(self.rank),
                np.int32(self.nranks), np.int32(p.pub_blocks), np.int32(p.out_blocks), np.int32(p.nred),
                np.int32(p.src_root), np.int32(p.slot_block), np.int32(phase), np.uint32(0), np.int32(kind))

    def pieces(self, g: GpuOp) -> list[Piece]:
        dt = g.out.array.dtype
        key = (g.name, g.count, g.root, g.op, dt.itemsize)
        got = self._pieces.get(key)
        if got is None:
            if len(self._pieces) >= 256:
                self._pieces.clear()
            cap = self.half_bytes // dt.itemsize
            steps = plans.ipc_pieces(g.name, self.rank, self.nranks, g.root, g.count, cap)
            got = [lower(s, g.count, self.rank, g.op, g.name, self.nranks) for s in steps] \
                or [Piece(0, 0, 0, 0, 0, 0, 0, 0)]  # nothing to move: still meet, and compare the calls
            self._pieces[key] = got
        return got

    def enqueue(self, g: GpuOp) -> None:
        """Launch ``g``'s pieces on its stream and complete its Work (raises the path's failure, if any)."""
        cp = self.cp
        if self.err[0] and self.failure is None:  # a kernel gave up since the last look: this op must not start
            self.fail(self._from_error_word())
        with self._lock:
            if self.failure is not None:
                raise self.failure
            stream = g.stream
            capturing = bool(getattr(stream, "is_capturing", lambda: False)())
            if capturing and self.form == "stream":
                raise InvalidArgument(f"{g.name}: capturing a CUDA graph needs the spin form (MPS, or one "
                                      f"process per GPU); these ranks share a GPU without it ({self.why})")
            with cp.cuda.Device(self.dev):
                launches, plan = self._launches(g)
                if plan is not None and self.lane is not None:  # launched by the native lane (gpu/lane.py)
                    ev = self.lane.enqueue(plan, stream.ptr, g.seq, g.fp[0], g.timeout, (g.inp.array, g.out.array),
                                           not capturing)
                    if ev is not None:
                        g.work.event = ev
                    self.last = None if capturing else (g.seq, plan, stream.ptr, g.timeout)
                    g.work._set_result(g.result())
                    return
                self._order_after_last(stream, capturing)
                for launch, consume in launches:
                    e = self._epoch = self._epoch + 1
                    if consume is None:  # spin: the whole piece in one launch
                        launch(stream)
                    else:
                        self._stream_piece(launch, consume, stream, e)
                    self._recent[e & 0xFFFFFFFF] = (g.work.op, g.seq, g.timeout)
                    if len(self._recent) > 4096:
                        self._recent.popitem(last=False)
                if not capturing:
                    ev = cp.cuda.Event(disable_timing=True)
                    ev.record(stream)
                    g.work.event = ev
                    self._track(_Tracked(ev, g.seq, g.work.op, time.monotonic() + g.timeout + 1.0, self.epoch,
                                         g.timeout, (g.inp.array, g.out.array)))
        g.work._set_result(g.result())

    def _launches(self, g: GpuOp) -> tuple[list[tuple[Launch, Launch | None]], Any]:
        """(launch, the stream form's consume launch) per piece of ``g``, and their native plan when the lane
        can run them (else None), kept per call: the same call on the same buffers (a training loop) builds
        nothing."""
        dt = g.out.array.dtype
        in_ptr, out_ptr = g.inp.array.data.data.ptr, g.out.array.data.data.ptr
        key = (g.fp, g.op, in_ptr, out_ptr, g.timeout)
        got = self._launch_cache.get(key)
        if got is not None:
            return got, self._plans.get(key)
        pieces = self.pieces(g)
        small = (self.form == "spin" and g.name == "all_reduce" and 0 < g.count * dt.itemsize <= self.small_bytes
                 and len(pieces) == 1 and pieces[0].nred == self.nranks)
        kern = self.kernel(dt, g.op, small)
        fp, kind = fingerprint(*g.fp), g.fp[0]
        got = []
        for p in pieces:
            def args(phase: int, p: Piece = p) -> tuple[Any, ...]:
                return self.args(in_ptr, out_ptr, g.count, p, fp, g.timeout, phase, kind)

            if self.form == "spin":
                got.append((Launch(kern, 1 if small else self.spin_grid, K.THREADS,
                                   args(K.PUBLISH | K.SYNC | K.CONSUME), EPOCH_ARG), None))
            else:
                grid = max(1, min(MAX_GRID, (p.n * max(1, p.pub_blocks, p.out_blocks) + K.THREADS - 1) // K.THREADS))
                got.append((Launch(kern, grid, K.THREADS, args(K.PUBLISH), EPOCH_ARG),
                            Launch(kern, grid, K.THREADS, args(K.CONSUME), EPOCH_ARG)))
        if len(self._launch_cache) >= 512:
            self._launch_cache.clear()
            self._plans.clear()
        self._launch_cache[key] = got
        plan = self._plans[key] = native_lane.plan(got) if self.lane is not None else None
        return got, plan

    def _stream_piece(self, publish: Launch, consume: Launch, stream: Any, e: int) -> None:
        """Publish; this rank's flag word 0 := e (after the publish, fenced); wait for every peer's; consume."""
        publish(stream, e)
        self._write(stream.ptr, self.own, e)
        for r in range(self.nranks):
            if r != self.rank:
                self._wait(stream.ptr, self._table.ptr(r), e)
        consume(stream, e)

    def _order_after_last(self, stream: Any, capturing: bool) -> None:
        """A communicator's ops run one after the other on the GPU, whatever streams they are issued on
        (as NCCL's do): the scratch halves and the epochs assume it."""
        last = self._last_stream
        if last is not None and last != stream and not capturing:
            ev = self.cp.cuda.Event(disable_timing=True)
            ev.record(last)
            stream.wait_event(ev)
        self._last_stream = stream

    def _drop_done(self) -> _Tracked | None:
        """Forget the ops whose kernels have run (their buffers go with them); the oldest still queued."""
        while self._tracked and self._tracked[0].event.done:
            self._tracked.popleft()
        return self._tracked[0] if self._tracked else None

    def _oldest(self) -> _Tracked | None:
        """The oldest op still queued on the GPU, the lane's or this path's own."""
        if self.lane is None:
            with self._lock:
                return self._drop_done()
        got = self.lane.oldest()
        if got is None:
            return None
        seq, kind, epoch, deadline, timeout = got
        return _Tracked(None, seq, name_of(kind, "GPU op"), deadline, epoch, timeout, None)

    def _track(self, t: _Tracked) -> None:
        self._drop_done()
        if len(self._tracked) >= TRACKED:  # the budget: wait for the oldest (its deadline bounds the wait)
            self._tracked.popleft().event.synchronize()
        self._tracked.append(t)

    # -- the watch (the engine's loop) -------------------------------------------------------------
    def poll(self) -> AiocclError | None:
        """Check the error word and the oldest pending op's deadline; the failure, once there is one."""
        if self.failure is not None:
            return self.failure
        exc: AiocclError | None = None
        if self.err[0]:
            exc = self._from_error_word()
        else:
            t = self._oldest()
            if t is not None and time.monotonic() > t.deadline:
                exc = CollectiveTimeout(t.name, t.seq, self._behind(t.epoch), t.timeout,
                                        "not done on the GPU (stream waits on the peers' flags)", self._comm_id)
        if exc is not None:
            self.fail(exc)
        return exc

    def fail(self, exc: AiocclError) -> None:
        """Every later op raises ``exc``; kernels still spinning give up, stream waits are released."""
        with self._lock:
            if self.failure is not None:
                return
            self.failure = exc
        if self.lane is not None:
            self.lane.enabled = False
        (_log.warning if isinstance(exc, CommAborted) else _log.error)("%s", exc)
        if self.err[0] == 0:
            self.err[0] = K.ERR_ABORT
        if self.form == "stream":
            try:
                with self.cp.cuda.Device(self.dev):
                    s = self._side()
                    for r in range(self.nranks):  # far ahead of any epoch this rank waits for
                        self._write(s.ptr, self._table.ptr(r), self.epoch + (1 << 30))
            except Exception as e:  # noqa: BLE001
                _log.warning("could not release the stream waits: %s", e)

    def _side(self) -> Any:
        if self._side_stream is None:
            self._side_stream = self.cp.cuda.Stream(non_blocking=True)
        return self._side_stream

    def _read(self, ptr: int, nbytes: int) -> np.ndarray:
        """Device memory (this rank's or a peer's header) read on a private non-blocking stream into pinned
        memory, so the copy waits for nothing else: another stream of this rank may be stuck in a wait."""
        assert nbytes <= 8
        with self.cp.cuda.Device(self.dev):
            s = self._side()
            self.cp.cuda.runtime.memcpyAsync(self._err_ptr + 16, ptr, nbytes, D2H, s.ptr)
            s.synchronize()
        return np.frombuffer(memoryview((ctypes.c_char * nbytes).from_address(self._err_ptr + 16)).cast("B"),
                             dtype=np.uint8).copy()

    def _behind(self, epoch: int) -> list[int]:
        try:
            return [r for r in range(self.nranks) if r != self.rank
                    and ((int(self._read(self._table.ptr(r), 4).view(np.uint32)[0]) - epoch) & 0xFFFFFFFF) >= 1 << 31]
        except Exception:  # noqa: BLE001 - the report must not fail
            return [r for r in range(self.nranks) if r != self.rank]

    def _from_error_word(self) -> AiocclError:
        code, peer, epoch, kind = (int(v) for v in self.err)
        name, seq, timeout = self._recent.get(epoch, (name_of(kind, "GPU op"), -1, 0.0))
        if self.lane is not None and (got := self.lane.recent(epoch)) is not None:
            name, seq, timeout = name_of(got[1], "GPU op"), got[0], got[2]
        where = f"device op #{epoch}"
        if code == K.ERR_TIMEOUT:
            return CollectiveTimeout(name, seq, [peer], timeout,
                                     f"a kernel waited past the op's deadline for rank {peer}'s flag ({where})",
                                     self._comm_id)
        if code == K.ERR_MISMATCH:
            slot = K.FP_OFFSET + 8 * (epoch & 1)
            try:
                theirs = int(self._read(self._table.ptr(peer) + slot, 8).view(np.uint64)[0])
                mine = int(self._read(self.own + slot, 8).view(np.uint64)[0])
                a, b = describe_call(unpack_fingerprint(theirs)), describe_call(unpack_fingerprint(mine))
            except Exception:  # noqa: BLE001
                a = b = "another call"
            return CollectiveMismatch(f"collective mismatch at seq {seq} on the GPU ({where}): rank {peer} issued "
                                      f"{a}, rank {self.rank} issued {b}", seq, (peer, self.rank), (a, b))
        return CommAborted(f"GPU ops on this communicator were aborted ({where})")

    # -- lifetime ----------------------------------------------------------------------------------
    def release(self) -> None:
        """Let the queued ops end, unmap the peers' scratch, free this rank's (errors are logged).

        Each queued op ends: it completes, or its kernel gives up at the deadline (spin), or ``poll`` finds it
        past the deadline and frees the stream's waits (stream), so neither loop nor synchronisation can
        hang on a peer that is gone."""
        if self.lane is not None:
            self.lane.close()  # no op reaches this path's memory through the lane from here on
        while self.failure is None:
            if self._oldest() is None:
                break
            self.poll()
            time.sleep(0.001)
        rt = self.cp.cuda.runtime
        try:
            with self.cp.cuda.Device(self.dev):
                self.cp.cuda.Device(self.dev).synchronize()
        except Exception as e:  # noqa: BLE001
            _log.warning("synchronising the GPU at close failed: %s", e)
        for err in self._table.close():
            _log.warning("closing a peer's CUDA IPC mapping failed: %s", err)
        for free, ptr in ((rt.free, self.own), (rt.freeHost, self._err_ptr)):
            try:
                free(ptr)
            except Exception as e:  # noqa: BLE001
                _log.warning("freeing GPU path memory failed: %s", e)
        self.err = np.zeros(4, np.uint32)
