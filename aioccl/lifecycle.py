"""A communicator's life after creation: ``split``, ``shrink``, ``close``, ``abort``, ``async with``.

A part of each ``Communicator`` (``Lifecycle``), given what it acts on: the engine, the communicator's
state, its launcher (the GPU path to release), planner and CPU lane (a new channel's), and how to derive a
child. Each ends or derives a communicator, so each must reckon with the ops still
in flight: ``close`` lets them finish within a deadline, ``abort`` fails
them now, ``shrink`` replaces a communicator whose peer was lost, and
``split`` makes children that share their parent's connections.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from . import log
from .errors import AiocclError, CollectiveTimeout, CommAborted, InvalidArgument
from .introspection import pending_op
from .work import Work, completed, mark_told

if TYPE_CHECKING:
    from collections.abc import Callable

    from .communicator import Communicator
    from .engine.engine import Engine
    from .lanes.cpu import CpuLane
    from .launch import Launcher
    from .planning import Planner
    from .state import CommState

_log = log.get("COLL")


class Lifecycle:
    """How one communicator (``state``) ends or derives others. ``derive(ranks, ctx, shrunk, owns_engine)``
    makes a communicator of some of its ranks on the same engine; ``all_gather``: its own (``split`` is one);
    ``owns_engine``: closing it closes the engine (passed on by ``shrink``)."""

    def __init__(self, engine: Engine, state: CommState, launcher: Launcher, planner: Planner, cpu: CpuLane,
                 derive: Callable[[list[int], int, bool, bool], Communicator],
                 all_gather: Callable[..., Work[Any]], owns_engine: bool) -> None:
        self._engine = engine
        self._state = state
        self._view = state.view
        self._launcher = launcher
        self._planner = planner
        self._cpu = cpu
        self._derive = derive
        self._all_gather = all_gather
        self.owns_engine = owns_engine
        self._subs: list[Communicator] = []
        self._groups_made: dict[tuple[tuple[int, ...], str], int] = {}  # create_group's per-group serials

    def __repr__(self) -> str:
        return f"<aioccl.Communicator rank {self._view.rank}/{self._view.size} ctx {self._view.ctx:x}>"

    async def open_channel(self, timeout: float, what: str) -> None:
        """A new communicator's shared-memory channel, when its ranks share one host (on the engine loop; every
        member calls it at the same point, before any op on it)."""
        from .engine.shm.setup import setup

        self._state.shm = await setup(self._engine, self._view, timeout, what)
        self._planner.forget()  # schedules chosen before: sockets
        if self._state.shm is not None:
            self._cpu.open()

    def split(self, color: int | None, key: int | None = None, *,
              timeout: float | None = None) -> Work[Communicator | None]:
        """``Communicator.split``: an all_gather of (color, key), then the child, its channel opened."""
        if color is not None and (not isinstance(color, (int, np.integer)) or color < 0):
            raise InvalidArgument(f"color must be a non-negative int or None, got {color!r}")
        if key is not None and not isinstance(key, (int, np.integer)):
            raise InvalidArgument(f"key must be an int or None, got {key!r}")
        me, n = self._view.rank, self._view.size
        mine = np.array([-1 if color is None else color, me if key is None else key], dtype=np.int64)
        t = self._state.op_timeout(timeout)
        gathered = self._all_gather(mine, timeout=t)
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
            table = w.result().reshape(n, 2)
            members = sorted((int(table[r, 1]), r) for r in range(n) if table[r, 0] == color)
            digest = hashlib.blake2b(f"{self._view.ctx}:{w.seq}:{color}".encode(), digest_size=8).digest()
            sub = self._derive([r for _, r in members], int.from_bytes(digest, "little") >> 1, False, False)
            eng.launch(lambda: self._adopt(sub, result, t, "split"))

        gathered._on_done(finish)
        return result

    def create_group(self, ranks: list[int], *, tag: str = "", timeout: float | None = None) -> Work[Communicator]:
        """``Communicator.create_group``: the members agree on its identity without asking the others."""
        if (not isinstance(ranks, (list, tuple)) or not ranks
                or any(not isinstance(r, (int, np.integer)) or not 0 <= r < self._view.size for r in ranks)
                or len(set(ranks)) != len(ranks)):
            raise InvalidArgument(f"create_group: ranks must be distinct ranks of this communicator "
                                  f"(0..{self._view.size - 1}), got {ranks!r}")
        members = [int(r) for r in ranks]
        if self._view.rank not in members:
            raise InvalidArgument(f"create_group: rank {self._view.rank} is not in {members}; only members call it")
        t = self._state.op_timeout(timeout)
        self._state.usable()
        with self._state.lock:
            serial = self._groups_made.get((tuple(members), tag), 0)
            self._groups_made[(tuple(members), tag)] = serial + 1
        digest = hashlib.blake2b(f"{self._view.ctx}:group:{members}:{tag}:{serial}".encode(), digest_size=8).digest()
        sub = self._derive(members, int.from_bytes(digest, "little") >> 1, False, False)
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
        """``Communicator.shrink``: the survivors agree (``recovery.py``), then the successor takes the engine."""
        t = self._state.op_timeout(timeout)
        if self._state.closed is not None:  # a lost member is what shrink is for: only a closed one refuses
            raise self._state.closed
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
        owns, self.owns_engine = self.owns_engine, False
        new = self._derive(alive, int.from_bytes(digest, "little") >> 1, True, owns)
        lost = [r for r in range(self._view.size) if r not in alive]
        self._state.close_with(CommAborted(f"{self!r} was shrunk to {new!r} (lost ranks {lost}); use the new one"))
        _log.warning("shrunk to %d ranks without %s: now rank %d", len(alive), lost, new.rank)
        return new

    def close(self, *, timeout: float | None = None) -> Work[None]:
        """``Communicator.close``: receives withdrawn, the rest let finish within ``timeout``, then released."""
        t = self._state.op_timeout(timeout)
        if not self._state.close_with(CommAborted(f"{self!r} is closed")):
            return completed("close", -1, None)
        pending = list(self._state.inflight)
        work: Work[None] = Work("close", -1)
        work._bind(self._engine.placement)
        owns = self.owns_engine
        eng = self._engine
        launcher = self._launcher

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
            if launcher.gpu is not None:
                launcher.gpu.release()
            chan = self._state.shm
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
        """``Communicator.abort``: every op in flight fails now; never blocks."""
        exc = CommAborted(f"{self!r} was aborted")
        if not self._state.close_with(exc, abort=True):
            return
        mark_told(exc)  # (the app called abort(): the ops it fails are not reported again at exit)
        for w in list(self._state.inflight):
            w._set_exception(exc)
        if self._launcher.gpu is not None:
            self._launcher.gpu.abort(exc)
        eng = self._engine
        chan = self._state.shm
        if chan is not None and chan is not eng.shm and not self.owns_engine and not eng.loop.is_closed():
            if eng.placement.on_loop_thread():
                eng.detach_channel(chan, exc)
            else:
                eng.placement.call(eng.detach_channel, chan, exc)
        if self.owns_engine:
            if eng.placement.on_loop_thread():
                eng.abort_on_loop(exc)
            elif not eng.loop.is_closed():
                eng.placement.call(eng.abort_on_loop, exc)
            eng.placement.stop(join=False)
