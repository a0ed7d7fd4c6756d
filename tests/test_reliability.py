"""Cancellation, pending(), the flight recorder, abort, close with a deadline, shrink after a lost rank.

Three communicators in this process, over sockets and over shared memory
(``comms3``); the multi-process forms of the same behaviour run in
test_errors.py, test_launcher.py, test_multihost_netns.py and the examples.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import aioccl

from conftest import close_all, make_comms

N = 3

# every op: (start it on rank r, the exact result rank r must get)
OPS: dict[str, tuple[Callable[[aioccl.Communicator, int], aioccl.Work], Callable[[int], Any]]] = {
    "all_reduce": (lambda c, r: c.all_reduce(np.full(6, r + 1, np.int32)), lambda r: np.full(6, 6)),
    "broadcast": (lambda c, r: c.broadcast(np.full(6, r, np.int32), root=2), lambda r: np.full(6, 2)),
    "reduce": (lambda c, r: c.reduce(np.full(6, r + 1, np.int32), root=0), lambda r: np.full(6, 6) if r == 0 else ...),
    "all_gather": (lambda c, r: c.all_gather(np.full(2, r, np.int32)), lambda r: np.repeat(np.arange(N), 2)),
    "reduce_scatter": (lambda c, r: c.reduce_scatter(np.full(6, r + 1, np.int32)), lambda r: np.full(2, 6)),
    "gather": (lambda c, r: c.gather(np.full(2, r, np.int32), root=0),
               lambda r: np.repeat(np.arange(N), 2) if r == 0 else None),
    "scatter": (lambda c, r: c.scatter(np.arange(6, dtype=np.int32) if r == 2 else None, root=2,
                                       out=None if r == 2 else np.full(2, -1, np.int32)),
                lambda r: np.arange(2 * r, 2 * r + 2)),
    "all_to_all": (lambda c, r: c.all_to_all(np.arange(6, dtype=np.int32) + 10 * r),
                   lambda r: np.array([10 * j + 2 * r + k for j in range(N) for k in range(2)])),
    "barrier": (lambda c, r: c.barrier(), lambda r: None),
    "send/recv": (lambda c, r: ((c.isend(np.full(4, 7, np.int32), 1, tag=9),
                                 c.isend(np.full(4, 7, np.int32), 0, tag=9))[1] if r == 2 else
                                c.irecv(np.full(4, -1, np.int32), 2, tag=9)),
                  lambda r: np.full(4, 7) if r < 2 else None),
}


def _check(name: str, r: int, got: Any) -> None:
    want = OPS[name][1](r)
    if want is ...:
        return  # a non-root's reduce result is unspecified
    if want is None:
        assert got is None or name == "send/recv", (name, r, got)
    else:
        np.testing.assert_array_equal(got, want, err_msg=f"{name} rank {r}")


@pytest.mark.parametrize("name", sorted(OPS))
async def test_cancelling_the_awaiting_task_leaves_the_op_running_on_every_op(comms3, name):
    """The documented meaning: an await is abandoned, the op is not (peers count on it). A receive no
    message has matched is withdrawn instead (tests/test_app_first_day.py), unless shielded, as here."""
    start = OPS[name][0]
    # rank 2 comes late; ranks 0 and 1 give up waiting (asyncio.timeout cancels their awaits)
    works = [start(comms3[r], r) for r in range(2)]
    if name == "send/recv":
        works = [w.shield() for w in works]
    abandoned = 0
    for w in works:
        try:
            async with asyncio.timeout(0.05):
                await w
        except TimeoutError:
            abandoned += 1
            assert not w.done()
    assert abandoned >= 1  # a send-only part (a reduce leaf, a send) may finish without rank 2
    if name != "send/recv":  # a started collective is a promise to the other ranks
        assert not any(w.cancel() for w in works) and not any(w.cancelled() for w in works)
    late = start(comms3[2], 2)
    results = await asyncio.wait_for(asyncio.gather(*works, late), 10)
    for r, got in enumerate(results):
        _check(name, r, got)
    # and the communicator is in step for the next op
    xs = [np.full(5, r, np.int64) for r in range(N)]
    await asyncio.wait_for(asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms3, xs, strict=True))), 10)
    assert all((x == 3).all() for x in xs)


async def test_anyio_cancel_scope_around_an_await():
    anyio = pytest.importorskip("anyio")
    comms = await make_comms(2, transport="tcp")
    try:
        w = comms[0].all_reduce(np.ones(3))
        with anyio.move_on_after(0.05) as scope:
            await w
        assert scope.cancelled_caught and not w.done()
        await comms[1].all_reduce(np.ones(3))
        assert (await w == 2).all()
    finally:
        await close_all(comms)


async def test_per_op_timeout_and_env_default(monkeypatch):
    monkeypatch.setenv("AIOCCL_TIMEOUT", "0.4")
    comms = await make_comms(2, timeout=None, transport="tcp")  # type: ignore[arg-type]
    try:
        t0 = time.monotonic()
        with pytest.raises(aioccl.CollectiveTimeout) as info:
            await comms[0].barrier()  # the default from AIOCCL_TIMEOUT
        assert 0.3 < time.monotonic() - t0 < 3 and info.value.timeout == 0.4
        with pytest.raises(aioccl.CollectiveTimeout) as info:
            await comms[0].all_reduce(np.ones(2), timeout=0.1)  # per op beats the default
        assert info.value.timeout == 0.1 and info.value.seq == 1 and info.value.waiting_for == [1]
    finally:
        for c in comms:
            c.abort()


@pytest.mark.parametrize("transport", ["tcp", "shm", "ib"])
@pytest.mark.parametrize("early", [0, 1])
async def test_a_timeout_told_by_a_peer_names_the_root_cause_not_the_rank_in_between(transport, early):
    """Rank 2 never calls. The rank with the short deadline gives up first, naming whom it waits for
    (maybe the other caller, itself stuck on rank 2); that rank's error must still name rank 2."""
    comms = await make_comms(N, transport=transport)
    try:
        works = [comms[r].all_reduce(np.full(4, 1.0), timeout=0.3 if r == early else 30) for r in range(2)]
        t0 = time.monotonic()
        errors = []
        for w in works:
            with pytest.raises(aioccl.CollectiveTimeout) as info:
                await asyncio.wait_for(w, 10)
            errors.append(info.value)
        assert time.monotonic() - t0 < 10
        late = errors[1 - early]
        assert late.waiting_for == [2], (str(late), str(errors[early]))
        assert late.seq == 0 and late.op == "all_reduce" and f"rank {early}" in str(late)
    finally:
        for c in comms:
            c.abort()


@pytest.mark.parametrize("transport", ["tcp", "shm", "ib"])
async def test_pending_names_the_silent_rank_and_the_recorder_keeps_history(transport):
    comms = await make_comms(N, transport=transport)
    try:
        await asyncio.gather(*(c.barrier() for c in comms))
        works = [comms[r].all_reduce(np.full(4, 1.0)) for r in range(2)]
        await asyncio.sleep(0.1)
        (p,) = comms[0].pending()
        assert (p.op, p.seq) == ("all_reduce", 1) and p.age_s >= 0.05
        assert p.waiting_for, p  # whom rank 0 waits on depends on the algorithm; somebody waits on 2
        assert any(2 in (comms[r].pending()[0].waiting_for or []) for r in range(2)), [c.pending() for c in comms]
        assert "4 x float64, sum" in p.detail and "waiting for ranks" in str(p)
        works.append(comms[2].all_reduce(np.full(4, 1.0)))
        await asyncio.gather(*works)
        assert comms[0].pending() == []
        recent = comms[0].recent()
        assert recent[0].startswith("barrier seq 0") and recent[1].startswith("all_reduce seq 1 (4 x float64, sum): ok")
    finally:
        await close_all(comms)


@pytest.mark.parametrize("transport", ["tcp", "shm", "ib"])
async def test_shrink_after_a_lost_rank_and_carry_on(transport):
    comms = await make_comms(N, transport=transport)
    a, dead, b = comms
    dead.abort()  # its connections drop, as in a crash
    for c in (a, b):
        with pytest.raises(aioccl.PeerLost) as info:
            await asyncio.wait_for(c.all_reduce(np.ones(4)), 5)
        assert info.value.rank == 1
    a2, b2 = await asyncio.wait_for(asyncio.gather(a.shrink(), b.shrink()), 10)
    assert (a2.rank, a2.world_size, b2.rank, b2.world_size) == (0, 2, 1, 2)
    xs = [np.full(5, 3, np.int64), np.full(5, 4, np.int64)]
    await asyncio.gather(a2.all_reduce(xs[0]), b2.all_reduce(xs[1]))
    assert all((x == 7).all() for x in xs)
    with pytest.raises(aioccl.CommAborted, match="shrunk"):
        a.all_reduce(np.ones(1))  # the old communicator hands over to the new one
    await asyncio.gather(a2.close(), b2.close())


async def test_abort_is_idempotent_and_never_blocks_from_another_thread():
    comms = await make_comms(2, engine="thread", transport="tcp")
    w = comms[0].all_reduce(np.ones(4))  # rank 1 never joins
    took: list[float] = []

    def from_thread() -> None:
        t0 = time.perf_counter()
        comms[0].abort()
        comms[0].abort()
        took.append(time.perf_counter() - t0)

    t = threading.Thread(target=from_thread)
    t.start()
    t.join(5)
    assert took and took[0] < 0.1, took
    with pytest.raises(aioccl.CommAborted):
        await w
    # Rank 0's half of the all_reduce may have left before the abort: then rank 1
    # finishes it exactly; otherwise it sees a lost rank. Either way, no hang.
    try:
        got = await asyncio.wait_for(comms[1].all_reduce(np.ones(4)), 5)
        assert got.tolist() == [2.0] * 4
    except aioccl.PeerLost:
        pass
    with pytest.raises(aioccl.PeerLost):  # nothing of rank 0's is left to arrive
        await asyncio.wait_for(comms[1].irecv(np.zeros(4), 0), 5)
    comms[1].abort()


async def test_close_drains_then_cuts_short_at_its_deadline():
    comms = await make_comms(2, transport="tcp")
    ok = [c.barrier() for c in comms]
    stuck = comms[0].all_reduce(np.ones(4))  # rank 1 never joins
    t0 = time.monotonic()
    with pytest.raises(aioccl.CollectiveTimeout) as info:
        await comms[0].close(timeout=0.3)
    assert time.monotonic() - t0 < 3
    assert info.value.op == "close" and "all_reduce" in str(info.value) and info.value.waiting_for == [1]
    await asyncio.gather(*ok)
    with pytest.raises(aioccl.CommAborted, match="close"):
        await stuck
    comms[1].abort()


@pytest.mark.parametrize("transport", ["shm", "tcp"])
async def test_a_bug_behind_the_reader_loses_the_peer_at_once_instead_of_hanging(transport, monkeypatch, caplog):
    """An exception the reader does not expect (a bug in the mailbox, say) leaves the stream unreadable:
    the connection is given up at once, naming the peer, instead of every op waiting for its deadline."""
    a, b = await make_comms(2, transport=transport, timeout=20)
    try:
        def broken(peer: int, h: object) -> None:
            raise KeyError("a bug")

        monkeypatch.setattr(b._engine.mailbox, "on_header", broken)
        got = np.zeros(4, np.float32)
        recv = b.irecv(got, 0, timeout=20)
        t0 = time.monotonic()
        await a.isend(np.ones(4, np.float32), 1)
        with pytest.raises(aioccl.PeerLost, match="internal error reading from rank 0"):
            await asyncio.wait_for(recv, 10)
        assert time.monotonic() - t0 < 5
        assert "internal error reading from rank 0" in caplog.text
    finally:
        for c in (a, b):
            c.abort()


def test_a_raising_done_callback_is_logged_and_the_others_still_run(caplog):
    w: aioccl.Work[int] = aioccl.Work("all_reduce", 3)
    seen: list[int] = []

    def bad(_w: aioccl.Work[int]) -> None:
        raise RuntimeError("the caller's bug")

    w.add_done_callback(bad)
    w.add_done_callback(lambda x: seen.append(x.result()))
    w._start()
    w._set_result(7)
    assert seen == [7] and w.result() == 7
    assert "a done callback of <Work all_reduce seq=3 done> raised" in caplog.text
