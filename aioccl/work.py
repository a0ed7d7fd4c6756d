"""The handle every op returns at once.

A ``Work`` is completed by the engine, which may run on another thread
and another event loop than the caller's. It is therefore a small
thread-safe future: awaitable from *any* asyncio loop (each awaiter gets a
future on its own loop, woken with ``call_soon_threadsafe`` when needed), and
blockable with ``wait()`` from plain threads. Under trio, awaiting parks
the task through ``aioccl.async_libs.trio_wait()``.

Cancelling the task that awaits a Work withdraws the op when no peer can
have seen it yet (an unmatched receive, a send not yet started). A receive
that has taken its message (matched, or done) refuses the cancel: the
awaiting task waits on and gets the message, so a timed-out receive never
loses one (asyncio's ``Queue.get`` never takes an item for a getter whose
await raised; Trio's operations past their point of no return refuse the
abort). Any other op runs on and the cancel stands, because peers are
already counting on it (a collective is a promise to the other ranks: use
``comm.abort()``). ``work.shield()`` opts a Work out: the cancel stands and
the op stays posted for a later await. A withdrawn op raises
``OpCancelled``, never the caller's own ``CancelledError``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from . import async_libs, log, native
from .envvars import check_timeout
from .errors import OpCancelled
from .placement import Placement, lent_here

T = TypeVar("T")
_PENDING, _RUNNING, _DONE, _CANCELLED = range(4)
FAIRNESS_S = 0.001


class _Turns(threading.local):
    last = 0.0  # when this thread's awaiting task last let its loop run (time.monotonic())


_turns = _Turns()
_running_loop = asyncio._get_running_loop  # (C; None outside a running loop: trio, or no loop)
_clock = time.monotonic


def _given(value: Any) -> Generator[Any, None, Any]:
    """The awaitable of a result already there: returns it without suspending."""
    return value
    yield  # (a generator: this function's frame is the whole cost of awaiting a done op)


class _AwaitingInPython:
    """``await work`` of an op already done, on the Python path (``AIOCCL_NATIVE=0``); the native core's
    ``Awaiting`` (``native/src/py/awaiting.c``) is the same rule in C, four times cheaper.

    An op done inside the call (the native lanes, shared memory) on asyncio, its loop given a turn lately,
    gives its result without a suspension (the hot path of ``await comm.all_reduce(x)``); anything else
    is ``Work._await``'s."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, Any]:
        w = cast("Work[Any]", self)  # (the base of Work only)
        if w._state >= _DONE and w._exc is None and _clock() - _turns.last <= FAIRNESS_S and \
                _running_loop() is not None:
            w._retrieved = True
            return _given(w._result)
        return w._await()


if native.core is not None and not TYPE_CHECKING:
    _Awaiting = native.core.Awaiting
    _turned, _last_turn = native.core.loop_turned, native.core.last_turn
else:
    _Awaiting = _AwaitingInPython

    def _turned() -> None:
        """This thread's loop has a turn now (through one of our awaits)."""
        _turns.last = _clock()

    def _last_turn() -> float:
        return _turns.last


class _BeforeBlocking(threading.local):
    """A thread's hook, called each time ``wait()`` is about to block. A thread that runs calls on another's
    behalf sets it (jax_ext's guard, ``jax_ext/interrupts.py``): calls issue every op before their first wait,
    so the hook tells the other thread that the call's ops are all issued."""

    hook: Callable[[], None] | None = None


BEFORE_BLOCKING = _BeforeBlocking()
BORN_DONE_LOCK = threading.Lock()  # the lock of every Work the native core makes done (nothing waits on one)
_log = log.get("COLL")


class Work(_Awaiting, Generic[T]):
    """An in-flight op; ``await work`` returns its result or raises its error.

    ``Work[T]`` gives a ``T``: ``Work[None]`` for ``barrier``, sends and ``close``;
    ``Work[Any]`` for ops that give back the caller's own array type.
    ``op`` names the op (``"all_reduce"``, ``"recv(peer=1, tag=3)"``); ``seq`` is its sequence
    number on the communicator (point-to-point: the tag); a receive's ``status`` says whose message it got
    (``Status(source, tag)``: what a receive from ``ANY_SOURCE`` or with ``ANY_TAG`` matched); ``event``
    is, for ops on GPU buffers, a CUDA event recorded right after the results (None for host buffers).
    """

    __slots__ = ("op", "seq", "_lock", "_state", "_result", "_exc", "_callbacks",
                 "_event", "_cancellable", "_on_cancel", "_engine_thread", "_t0", "_desc", "_probe",
                 "event", "_next_warn", "_retrieved", "status", "_withdraw", "_home")

    def __init__(self, op: str, seq: int, *, cancellable: bool = False) -> None:
        self.op = op
        self.seq = seq
        self._lock = threading.Lock()
        self._state = _PENDING
        self._result: Any = None
        self._exc: BaseException | None = None
        self._callbacks: list[Callable[[Work[T]], None]] = []
        self._event: threading.Event | None = None
        self._cancellable = cancellable
        self._on_cancel: Callable[[], object] | None = None
        self._engine_thread: int | None = None  # wait() on this thread would deadlock
        self._home: Placement | None = None  # the engine whose thread runs the done callbacks
        self._t0 = 0.0  # time.monotonic() when issued
        self._desc: Any = ""  # (count, dtype, reduction, root), formatted lazily by pending() and the recorder
        self._probe: Callable[[], list[int] | None] | None = None  # set by the engine: ranks it waits for now
        self._retrieved = False  # whether anybody looked at the outcome (an error nobody saw is reported)
        self._next_warn = 0.0  # the watchdog logs this op again once it is this old (seconds)
        self.event: Any = None  # ops on GPU buffers: a CUDA event recorded right after the results, once done
        self.status: Any = None  # a receive: the Status (source, tag) of the message it got, once done
        self._withdraw = cancellable  # cancelling an awaiting task withdraws the op (unless shield())

    def __repr__(self) -> str:
        state = ("pending", "running", "done", "cancelled")[self._state]
        return f"<Work {self.op} seq={self.seq} {state}>"

    # -- engine side ------------------------------------------------------
    def _bind(self, placement: Placement) -> None:
        """The op runs on this engine: its done callbacks run on its thread, and wait() there raises."""
        self._home = placement
        self._engine_thread = placement.thread_id

    def _on_done(self, fn: Callable[[Work[T]], None]) -> None:
        """Internal: ``fn(work)`` on whichever thread completes the op, or now, here, if it is done."""
        with self._lock:
            if not self.done():
                self._callbacks.append(fn)
                return
        fn(self)

    def _start(self) -> bool:
        """Engine claims the op; False if it was cancelled first."""
        with self._lock:
            if self._state != _PENDING:
                return False
            self._state = _RUNNING
            return True

    def _start_done(self, result: T) -> None:
        """``_start`` and ``_set_result`` in one step: an op that finished inside the call that issued it."""
        self._finish(result, None, claim=True)

    def _set_result(self, result: T) -> None:
        self._finish(result, None)

    def _set_exception(self, exc: BaseException) -> None:
        self._finish(None, exc)

    def _finish(self, result: Any, exc: BaseException | None, state: int = _DONE, claim: bool = False) -> bool:
        with self._lock:
            if self._state >= (_RUNNING if claim else _DONE):  # done or cancelled (claim: or started)
                return False
            self._state = state
            self._result, self._exc = result, exc
            callbacks, self._callbacks = self._callbacks, []
            event = self._event
        if event is not None:
            event.set()
        for cb in callbacks:
            try:
                cb(self)
            except Exception:  # a caller's callback must not break the engine that completes the op
                _log.exception("a done callback of %r raised", self)
        return True

    # -- user side --------------------------------------------------------
    def done(self) -> bool:
        """Whether the op has finished (with a result, an error, or cancelled)."""
        return self._state in (_DONE, _CANCELLED)

    def cancelled(self) -> bool:
        """Whether [`cancel`][aioccl.Work.cancel] withdrew the op."""
        return self._state == _CANCELLED

    def cancel(self, why: str = "by work.cancel()") -> bool:
        """Withdraw the op if no peer can have seen it yet (an unmatched receive, a send not yet started);
        returns whether it is withdrawn. Awaiting it then raises [`OpCancelled`][aioccl.OpCancelled]."""
        if self._state == _CANCELLED:
            return True
        withdrawn = self._withdraw_with(OpCancelled(self.op, self.seq, why), _CANCELLED)
        if withdrawn:
            self._retrieved = True  # withdrawn by the app: nothing for the exit report
        return withdrawn

    def _withdraw_with(self, exc: BaseException, state: int = _DONE) -> bool:
        """Take the op back unseen by any peer, ending it with ``exc``: False once it has started."""
        with self._lock:
            if self._state != _PENDING or not self._cancellable:
                return False
            on_cancel = self._on_cancel
        if not self._finish(None, exc, state):
            return False
        if on_cancel is not None:
            on_cancel()
        return True

    def shield(self) -> Work[T]:
        """Keep the op posted when a task awaiting it is cancelled; returns
        the Work itself: ``await comm.irecv(buf, peer).shield()``. ``cancel()`` still withdraws it."""
        self._withdraw = False
        return self

    def _abandoned(self) -> bool:
        """The task awaiting this Work was cancelled: withdraw the op if that is still possible. Returns whether
        the cancel stands; False: refused (``_keeps_its_message``), the awaiting task waits on for the result."""
        if self._withdraw and self._state == _PENDING:
            self.cancel("when the task awaiting it was cancelled")
        return not self._keeps_its_message()

    def _keeps_its_message(self) -> bool:
        """A receive (not shielded) that has taken a message: matched and running, or done with it. Giving up
        its await would lose the message (nobody keeps the Work of a receive they gave up on, and the next
        receive gets the next message), so a cancel of the await is refused. A shielded one stays posted for
        a later await instead; a failed one has no message to lose."""
        state = self._state
        shielded = self._cancellable and not self._withdraw  # (a Work born done in C is neither)
        return not shielded and (state == _RUNNING or (state == _DONE and self._exc is None)) \
            and self.op.startswith("recv(")

    def result(self) -> T:
        """The result if done (raising the op's error); InvalidStateError if not."""
        if not self.done():
            raise asyncio.InvalidStateError(f"{self!r} is not done; await it or call wait()")
        self._retrieved = True
        if self._exc is not None:
            mark_told(self._exc)
            raise self._exc
        result: T = self._result
        return result

    def exception(self) -> BaseException | None:
        """The op's error (None if it succeeded) once done; InvalidStateError before."""
        if not self.done():
            raise asyncio.InvalidStateError(f"{self!r} is not done; await it or call wait()")
        self._retrieved = True
        if self._exc is not None:
            mark_told(self._exc)
        return self._exc

    def add_done_callback(self, fn: Callable[[Work[T]], None]) -> None:
        """Call ``fn(work)`` once the op is done, always on the engine's thread, never inside this call.

        The engine's thread is the event loop that runs the engine: your own loop's thread for the inline
        engine, the proxy thread for ``init_sync()``, trio, or ``engine="thread"``. The rule holds whatever
        the op's size, transport or timing: an op already done gets ``fn`` scheduled there (as asyncio's
        ``Future.add_done_callback`` does), one completed by another thread (``abort()``, ``cancel()``) has
        it handed over. ``fn`` must not block: ``wait()`` raises there (chain instead, see ``wait``).
        """
        home = self._home
        if home is None:  # not an engine's op (a Work made done, as on a 1-rank shortcut): at once
            self._on_done(fn)
            return

        def deliver(w: Work[T]) -> None:
            if home.on_loop_thread() or home.loop.is_closed():
                _run_callback(fn, w)
            else:
                home.call(_run_callback, fn, w)

        with self._lock:
            if not self.done():
                self._callbacks.append(deliver)
                return
        if home.loop.is_closed():
            _run_callback(fn, self)
        else:
            home.call(_run_callback, fn, self)

    def wait(self, timeout: float | None = None) -> T:
        """Block the calling thread until done; return the result or raise its error.

        Raises ``TimeoutError`` if ``timeout`` passes first (the op keeps running).
        """
        if timeout is not None and not (type(timeout) in (int, float) and timeout == 0):  # 0: just poll
            timeout = check_timeout(timeout, "wait(timeout=...)")
        if self._engine_thread == threading.get_ident() or lent_here():
            raise RuntimeError(
                f"{self!r}.wait() on the engine's thread: blocking there would stop the event loop that completes "
                "the op, so wait() raises there always, even for an op already done. This thread runs the "
                "engine because it runs the event loop of an inline engine (aioccl.init() in asyncio) or a done "
                "callback. In a coroutine, 'await work'. In a done callback, chain: issue the next op there and "
                "give it its own add_done_callback, or hand the result to another task or thread "
                "(loop.call_soon_threadsafe, a queue) and wait there"
            )
        if not self.done():
            with self._lock:
                if self._event is None:
                    self._event = threading.Event()
                event = self._event
            if BEFORE_BLOCKING.hook is not None:
                BEFORE_BLOCKING.hook()
            try:
                finished = self.done() or event.wait(timeout)
            except BaseException:  # interrupted (Ctrl-C's KeyboardInterrupt): as a cancelled await
                self._abandoned()
                raise
            if not finished:
                raise TimeoutError(f"{self!r} not done after {timeout}s")
        return self.result()

    if TYPE_CHECKING:
        def __await__(self) -> Generator[Any, None, T]: ...  # (_Awaiting's, typed)

    def _await(self) -> Generator[Any, None, T]:
        """Awaiting when the result cannot simply be given (``_Awaiting`` above asks here)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not asyncio: trio (through the proxy-thread engine), or a clear error
            async_libs.current()
            result: T = yield from async_libs.trio_wait(self).__await__()
            return result
        if self._state >= _DONE:
            # ops that completed inside the call (shared memory) never suspend the awaiting task;
            # give the loop a turn at least every FAIRNESS_S so other tasks are not starved
            if _clock() - _last_turn() > FAIRNESS_S:
                _turned()
                try:
                    yield from asyncio.sleep(0).__await__()
                except asyncio.CancelledError:
                    if self._abandoned():
                        raise  # (refused: a receive's message is the caller's, given below)
        else:
            _turned()
            fut: asyncio.Future[None] = loop.create_future()
            me = threading.get_ident()

            def wake(_w: Work[T]) -> None:
                f = fut  # (the future awaited now: a refused cancel awaits a new one)
                if threading.get_ident() == me:
                    if not f.done():
                        f.set_result(None)
                elif not loop.is_closed():
                    loop.call_soon_threadsafe(_set_if_pending, f)

            self._on_done(wake)
            while True:
                try:
                    yield from fut.__await__()
                    break
                except asyncio.CancelledError:
                    if self._abandoned():
                        raise
                    # refused (a receive that has its message, or will): wait on, on a new future, which
                    # the same wake sets; the op may have finished meanwhile (``_finish`` marks it done first)
                    fut = loop.create_future()
                    if self._state >= _DONE:
                        break
        return self.result()


if native.core is not None:
    native.core.awaiting_setup(Work, FAIRNESS_S, _running_loop)


# the last errors the app was given (raised by result(), await or wait(), or returned by exception()): an op
# that failed with one of them and that nobody awaited is not reported again at exit (watchdog.py)
TOLD: deque[BaseException] = deque(maxlen=16)


def mark_told(exc: BaseException) -> None:
    """The app has this error (it was given it, or it caused it: its own ``abort()``)."""
    if not any(t is exc for t in TOLD):
        TOLD.append(exc)


def _run_callback(fn: Callable[[Work[Any]], None], w: Work[Any]) -> None:
    try:
        fn(w)
    except Exception:  # a caller's callback must not break the engine that runs it
        _log.exception("a done callback of %r raised", w)


def _set_if_pending(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def completed(op: str, seq: int, result: T) -> Work[T]:
    """A Work already done (n=1 shortcuts, empty groups)."""
    w: Work[T] = Work(op, seq)
    w._set_result(result)
    return w
