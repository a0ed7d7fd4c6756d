"""A communicator's life after creation: ``split``, ``shrink``, ``close``, ``abort``, ``async with``.

A mixin of ``Communicator``, like the collectives and point-to-point ops.
Each ends or derives a communicator, so each must reckon with the ops still
in flight: ``close`` lets them finish within a deadline, ``abort`` fails
them now, ``shrink`` replaces a communicator whose peer was lost, and
``split`` makes children that share their parent's connections.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from typing import TYPE_CHECKING, Any, Self

import numpy as np

from . import log
from .errors import AiocclError, CollectiveTimeout, CommAborted, InvalidArgument
from .introspection import pending_op
from .work import Work, completed

if TYPE_CHECKING:
    from .communicator import Communicator
    from .engine.engine import Engine
    from .engine.shm.channel import ShmChannel
    from .engine.view import CommView

_log = log.get("COLL")


class LifecycleOps:
    if TYPE_CHECKING:
        _engine: Engine
        _view: CommView
        _subs: list[Communicator]
        _groups_made: dict[tuple[tuple[int, ...], str], int]
        _owns_engine: bool
        _lock: threading.Lock
        _closed: BaseException | None
        _member_lost: Any
        _aborted: bool
        _inflight: set[Work[Any]]
        _gpu: Any
        _shm: ShmChannel | None

        def _derive(self, ranks: list[int], ctx: int, *, shrunk: bool) -> Communicator: ...

        async def _open_channel(self, timeout: float, what: str) -> None: ...

        @property
        def rank(self) -> int: ...

        @property
        def world_size(self) -> int: ...

        def _op_timeout(self, timeout: float | None) -> float: ...

        def _usable(self) -> None: ...

        def _lane_off(self) -> None: ...

        def all_gather(self, x: Any, out: Any = None, *, timeout: float | None = None) -> Work[Any]: ...

    def split(self, color: int | None, key: int | None = None, *,
              timeout: float | None = None) -> Work[Communicator | None]:
        """Collective: ranks with equal ``color`` form a new communicator, ordered by (key, rank).

        ``color=None`` takes part but gets None.
        """
        if color is not None and (not isinstance(color, (int, np.integer)) or color < 0):
            raise InvalidArgument(f"color must be a non-negative int or None, got {color!r}")
        if key is not None and not isinstance(key, (int, np.integer)):
            raise InvalidArgument(f"key must be an int or None, got {key!r}")
        mine = np.array([-1 if color is None else color, self.rank if key is None else key], dtype=np.int64)
        t = self._op_timeout(timeout)
        gathered = self.all_gather(mine, timeout=t)
        result: Work[Communicator | None] = Work("split", gathered.seq)
        result._bind(self._engine.placement)
        eng = self._engine

        def finish(w: Work[Any]) -> None:
            exc = w.exception()
            if exc is not None:
                result._set_exception(exc)
                return
            if color is None:
                result._set_result(None)
                return
            table = w.result().reshape(self.world_size, 2)
            members = sorted((int(table[r, 1]), r) for r in range(self.world_size) if table[r, 0] == color)
            digest = hashlib.blake2b(f"{self._view.ctx}:{w.seq}:{color}".encode(), digest_size=8).digest()
            sub = self._derive([r for _, r in members], int.from_bytes(digest, "little") >> 1, shrunk=False)
            eng.launch(lambda: self._adopt(sub, result, t, "split"))

        gathered._on_done(finish)
        return result

    def create_group(self, ranks: list[int], *, tag: str = "", timeout: float | None = None) -> Work[Communicator]:
        """Collective over ``ranks`` only (MPI's ``MPI_Comm_create_group``): the ranks listed, in that
        order, form a new communicator; the others do not call it.

        Every member passes the same ``ranks`` and ``tag``, and members create their groups in the same
        order (that is how they agree on the new communicator's identity without asking the others).
        Like a ``split`` child it shares this communicator's connections and, on one host, gets a
        shared-memory channel of its own. ``torch.distributed.new_group`` maps to it.
        """
        if (not isinstance(ranks, (list, tuple)) or not ranks
                or any(not isinstance(r, (int, np.integer)) or not 0 <= r < self.world_size for r in ranks)
                or len(set(ranks)) != len(ranks)):
            raise InvalidArgument(f"create_group: ranks must be distinct ranks of this communicator "
                                  f"(0..{self.world_size - 1}), got {ranks!r}")
        members = [int(r) for r in ranks]
        if self.rank not in members:
            raise InvalidArgument(f"create_group: rank {self.rank} is not in {members}; only members call it")
        t = self._op_timeout(timeout)
        self._usable()
        with self._lock:
            serial = self._groups_made.get((tuple(members), tag), 0)
            self._groups_made[(tuple(members), tag)] = serial + 1
        digest = hashlib.blake2b(f"{self._view.ctx}:group:{members}:{tag}:{serial}".encode(), digest_size=8).digest()
        sub = self._derive(members, int.from_bytes(digest, "little") >> 1, shrunk=False)
        work: Work[Communicator] = Work("create_group", -1)
        work._bind(self._engine.placement)

        self._engine.launch(lambda: self._adopt(sub, work, t, "create_group"))
        return work

    async def _adopt(self, sub: Communicator, work: Work[Any], timeout: float, what: str) -> None:
        """A new child's shared-memory channel (every member at the same point), then the child is this
        communicator's and ``work``'s result."""
        try:
            await sub._open_channel(timeout, what)
        except AiocclError as e:
            work._set_exception(e)
            return
        self._subs.append(sub)
        work._set_result(sub)

    def shrink(self, *, timeout: float | None = None) -> Work[Communicator]:
        """After [`PeerLost`][aioccl.errors.PeerLost]: the survivors agree on who is alive and form a new communicator.

        Every surviving rank calls it (it is collective over the survivors);
        the Work gives the new [`Communicator`][aioccl.Communicator], with ranks renumbered in
        the old order. It reuses the existing connections (so it takes
        milliseconds, not a new bootstrap) and runs over sockets. This
        communicator is then closed and hands the engine to the new one: close
        the new one at the end.
        """
        t = self._op_timeout(timeout)
        if self._closed is not None:  # a lost member is what shrink is for: only a closed one refuses
            raise self._closed
        work: Work[Communicator] = Work("shrink", -1)
        work._bind(self._engine.placement)
        eng, view = self._engine, self._view

        async def run() -> None:
            from .recovery import agree_on_survivors

            try:
                alive = await agree_on_survivors(eng, view, t)
            except AiocclError as e:
                work._set_exception(e)
                return
            new = self._successor(alive)
            try:
                await new._open_channel(t, "shrink")
            except AiocclError as e:
                new.abort()  # it owns the engine now, and nobody else will ever hold it
                work._set_exception(e)
                return
            work._set_result(new)

        eng.launch(run)
        return work

    def _successor(self, alive: list[int]) -> Communicator:
        digest = hashlib.blake2b(f"{self._view.ctx}:shrink:{alive}".encode(), digest_size=8).digest()
        new = self._derive(alive, int.from_bytes(digest, "little") >> 1, shrunk=True)
        new._owns_engine, self._owns_engine = self._owns_engine, False
        lost = [r for r in range(self.world_size) if r not in alive]
        with self._lock:
            self._closed = CommAborted(f"{self!r} was shrunk to {new!r} (lost ranks {lost}); use the new one")
        self._lane_off()
        _log.warning("shrunk to %d ranks without %s: now rank %d", len(alive), lost, new.rank)
        return new

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
        t = self._op_timeout(timeout)
        with self._lock:
            if self._closed is not None:
                return completed("close", -1, None)
            self._closed = CommAborted(f"{self!r} is closed")
        self._lane_off()
        pending = list(self._inflight)
        work: Work[None] = Work("close", -1)
        work._bind(self._engine.placement)
        owns = self._owns_engine
        eng = self._engine

        async def run() -> None:
            late: CollectiveTimeout | None = None
            for w in pending:
                if w.op.startswith("recv("):
                    w.cancel("by close()")
            try:
                async with asyncio.timeout(t):
                    for w in pending:
                        if w.cancelled():
                            continue
                        try:
                            await w
                        except Exception:  # noqa: BLE001 - close reports nothing about earlier ops
                            pass
            except TimeoutError:
                left = [w for w in pending if not w.done()]
                waiting = sorted({r for w in left for r in (pending_op(w, time.monotonic()).waiting_for or [])})
                late = CollectiveTimeout("close", -1, waiting, t, "still running: " + ", ".join(map(repr, left)),
                                         f"{self._view.ctx:x}")
                for w in left:
                    w._set_exception(CommAborted(f"{w!r} was cut short by close() after {t:g}s"))
                if owns:
                    eng.abort_on_loop(CommAborted(f"{self!r} is closed"))
            if self._gpu is not None:
                self._gpu.release()
            chan = self._shm
            if chan is not None and chan is not eng.shm:  # a child's own channel (the world's goes with the engine)
                eng.detach_channel(chan)
            if owns and late is None:
                await eng.shutdown()
            if late is not None:
                work._set_exception(late)
            else:
                work._set_result(None)
            if owns:
                eng.placement.stop()

        if eng.loop.is_closed():
            work._set_result(None)
        else:
            eng.launch(run)
        return work

    def abort(self) -> None:
        """Fail every in-flight op with CommAborted now and drop the connections (peers see PeerLost).

        Never blocks (the engine is told, not waited for), is idempotent, and may be called from any
        thread, a signal handler's included, or from a done callback.
        """
        exc = CommAborted(f"{self!r} was aborted")
        with self._lock:
            if self._aborted:
                return
            self._aborted = True
            self._closed = exc
        self._lane_off()
        for w in list(self._inflight):
            w._set_exception(exc)
        if self._gpu is not None:
            self._gpu.abort(exc)
        eng = self._engine
        chan = self._shm
        if chan is not None and chan is not eng.shm and not self._owns_engine and not eng.loop.is_closed():
            if eng.placement.on_loop_thread():
                eng.detach_channel(chan, exc)
            else:
                eng.placement.call(eng.detach_channel, chan, exc)
        if self._owns_engine:
            if eng.placement.on_loop_thread():
                eng.abort_on_loop(exc)
            elif not eng.loop.is_closed():
                eng.placement.call(eng.abort_on_loop, exc)
            eng.placement.stop(join=False)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            await self.close()
        else:
            self.abort()
