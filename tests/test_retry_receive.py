"""A receive whose await is cancelled never loses its message (docs/async.md, "What cancelling means").

asyncio's ``Queue.get()`` never takes an item for a getter whose await raised; Trio's operations past their
point of no return refuse the abort. aioccl does the second: a receive no message has matched is withdrawn
(the next receive gets the message), one that has taken its message refuses the cancel and its await
returns the message. The retry loop users write (``wait_for(comm.irecv(...), t)`` until it succeeds) then
sees every message once, in order, whatever the timeouts.
"""

from __future__ import annotations

import asyncio
import re
import threading

import anyio
import numpy as np
import pytest

from aioccl import native
from aioccl.work import Work

from conftest import TRANSPORT_ENV, launch

# (lib, transport, native core): every lib on both transports with the core, and each lib once without it
RUNS = [(lib, t, "1") for lib in ("asyncio", "anyio", "trio") for t in ("shm", "tcp")] + \
       [("asyncio", "tcp", "0"), ("anyio", "shm", "0"), ("trio", "shm", "0")]


@pytest.mark.parametrize(("lib", "transport", "native"), RUNS)
def test_the_retry_loop_loses_no_message(lib: str, transport: str, native: str) -> None:
    """tests/workers/retry_recv.py: 100 messages of 8 B, 100 of 64 KiB and 8 rendezvous ones (1 MiB + 4 KiB)
    sent at random gaps of 0-2 ms, each received by a retry loop of random 0.2-3 ms timeouts: every message
    exactly once, in order, every element exact."""
    done = launch(2, "retry_recv.py", lib, "100", "100", "8",
                  env={**TRANSPORT_ENV[transport], "AIOCCL_NATIVE": native}, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ok = re.findall(r"RETRY ok rank (\d) gave-up (\d+)", done.stdout)
    assert sorted(r for r, _ in ok) == ["0", "1"], done.stdout + done.stderr


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param  # type: ignore[no-any-return]


def _receive() -> Work[np.ndarray]:
    """A receive's Work as the engine holds it (the engine's side driven by hand below)."""
    return Work("recv(peer=0, tag=1)", 1, cancellable=True)


@pytest.mark.anyio
async def test_a_receive_that_has_its_message_refuses_the_cancel(anyio_backend: str) -> None:
    """Matched (running) when its await is cancelled: the await waits on and returns the message."""
    w = _receive()
    assert w._start()  # matched: the engine claimed it
    msg = np.arange(4)
    threading.Timer(0.1, w._set_result, (msg,)).start()  # the message lands later (another thread: the engine's)
    with anyio.move_on_after(0.01) as scope:
        got = await w
    assert got is msg and not scope.cancelled_caught  # the cancel was refused: the await gave the message


@pytest.mark.anyio
async def test_a_done_receive_whose_await_is_cancelled_gives_its_message(anyio_backend: str) -> None:
    """Done before the cancelled task looks: the cancel is refused at the await's schedule point."""
    w = _receive()
    assert w._start()
    w._set_result(np.arange(3))
    with anyio.CancelScope() as scope:
        scope.cancel()  # cancelled before the await
        got = await w
    assert (got == np.arange(3)).all()


@pytest.mark.asyncio
async def test_wait_for_returns_the_message_of_a_refused_cancel() -> None:
    """``asyncio.wait_for`` and ``asyncio.timeout`` return the value when the cancel is refused."""
    for how in ("wait_for", "timeout"):
        w = _receive()
        assert w._start()
        asyncio.get_running_loop().call_later(0.05, w._set_result, how)
        if how == "wait_for":
            got = await asyncio.wait_for(w, 0.005)
        else:
            async with asyncio.timeout(0.005):
                got = await w
        assert got == how


@pytest.mark.asyncio
async def test_the_cancel_stands_for_what_loses_nothing() -> None:
    """An unmatched receive is withdrawn; a shielded receive, a started send and a failed receive let the
    cancel stand (the shielded one stays posted for a later await)."""
    unmatched = _receive()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(unmatched, 0.005)
    assert unmatched.cancelled()
    shielded = _receive().shield()
    assert shielded._start()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(shielded, 0.005)
    shielded._set_result("later")
    assert await shielded == "later"
    send: Work[None] = Work("send(peer=1, tag=1)", 1, cancellable=True)
    assert send._start()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(send, 0.005)
    failed = _receive()
    assert failed._start()
    failed._set_exception(RuntimeError("lost"))
    assert not failed._keeps_its_message()  # (no message to lose: the cancel of its await stands)


@pytest.mark.anyio
@pytest.mark.skipif(native.core is None, reason="a receive done in the call is the native core's (AIOCCL_NATIVE=0: "
                    "it is posted to the engine, and an unmatched one is withdrawn, as the other tests check)")
async def test_a_receive_born_done_in_c_gives_its_message_to_a_cancelled_await(anyio_backend: str) -> None:
    """The pair lane's receive done in the call (a Work the native core made: not cancellable, never
    shielded) whose await is cancelled at its schedule point still gives its message."""
    from conftest import close_all_any, make_comms_any

    a, b = comms = await make_comms_any(2)
    try:
        for k in range(20):
            await a.isend(np.full(2, k), 1, tag=4)
            got = np.full(2, -1)
            w = b.irecv(got, 0, tag=4)  # (in the FIFO already: done in the call, on the native core)
            returned = False
            with anyio.CancelScope() as scope:
                scope.cancel()
                await w
                returned = True
            assert returned and not scope.cancelled_caught and (got == k).all()
    finally:
        await close_all_any(comms)
