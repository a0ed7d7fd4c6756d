"""The async API under anyio on both of its backends: asyncio (inline engine) and trio (proxy-thread engine).

Runs through anyio's pytest plugin; every test runs twice. Under trio the
engine runs on its proxy thread and each Work parks the trio task until the
engine's thread completes it.
"""

from __future__ import annotations

import threading

import anyio
import numpy as np
import pytest

import aioccl

from conftest import TRANSPORT_ENV, close_all_any, launch, make_comms_any

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param


async def awaited(w: aioccl.Work[object]) -> object:
    """A Work is an awaitable, not a coroutine; task groups start coroutine functions."""
    return await w


@pytest.mark.parametrize("transport", ["shm", "tcp"])
async def test_every_op_awaited_from_task_group_children(anyio_backend, transport):
    comms = await make_comms_any(3, transport)
    placement = "inline" if anyio_backend == "asyncio" else "thread"
    assert all(c.engine_placement == placement for c in comms)
    n = 3
    results: dict[tuple[int, str], object] = {}
    xs = [np.arange(6, dtype=np.int32) + 10 * r for r in range(n)]
    bufs = [np.full(6, -1, np.int32) for _ in range(n)]
    recvd = [np.full(6, -1, np.int32) for _ in range(n)]
    works = []
    for c in comms:  # issued in one order from one task; awaited from many
        r = c.rank
        works.append((r, "all_reduce", c.all_reduce(xs[r].copy())))
        works.append((r, "broadcast", c.broadcast(bufs[r] if r else np.arange(6, dtype=np.int32), root=0)))
        works.append((r, "reduce", c.reduce(xs[r].copy(), root=1, op="max")))
        works.append((r, "all_gather", c.all_gather(xs[r][:2])))
        works.append((r, "reduce_scatter", c.reduce_scatter(xs[r].copy())))
        works.append((r, "gather", c.gather(xs[r][:2], root=2)))
        works.append((r, "scatter", c.scatter(np.arange(6, dtype=np.int32) if r == 0 else None, root=0,
                                              out=np.full(2, -1, np.int32))))
        works.append((r, "all_to_all", c.all_to_all(xs[r].copy())))
        works.append((r, "barrier", c.barrier()))
        works.append((r, "recv", c.irecv(recvd[r], (r - 1) % n, tag=3)))
        works.append((r, "send", c.isend(xs[r], (r + 1) % n, tag=3)))

    async def wait(r: int, name: str, w: aioccl.Work) -> None:
        results[r, name] = await w

    async with anyio.create_task_group() as tg:
        for r, name, w in works:
            tg.start_soon(wait, r, name, w)
    total = sum(xs)
    for r in range(n):
        assert results[r, "all_reduce"].tolist() == total.tolist()
        assert bufs[r].tolist() == list(range(6)) if r else True
        assert (results[r, "reduce"].tolist() == xs[2].tolist()) if r == 1 else results[r, "reduce"] is None
        assert results[r, "all_gather"].tolist() == [0, 1, 10, 11, 20, 21]
        assert results[r, "reduce_scatter"].tolist() == total[2 * r:2 * r + 2].tolist()
        assert (results[r, "gather"].tolist() == [0, 1, 10, 11, 20, 21]) if r == 2 else results[r, "gather"] is None
        assert results[r, "scatter"].tolist() == [2 * r, 2 * r + 1]
        assert results[r, "all_to_all"].tolist() == [v for j in range(n) for v in xs[j][2 * r:2 * r + 2]]
        assert recvd[r].tolist() == xs[(r - 1) % n].tolist()
    await close_all_any(comms)


async def test_cancel_scope_withdraws_an_unmatched_receive(anyio_backend):
    comms = await make_comms_any(2)
    a, b = comms
    buf, nxt = np.full(4, -1, np.int64), np.full(4, -1, np.int64)
    recv = a.irecv(buf, 1, tag=9)
    with anyio.move_on_after(0.2) as scope:
        await recv  # nobody sends yet
    assert scope.cancelled_caught and recv.cancelled() and a.pending() == []
    await b.isend(np.arange(4, dtype=np.int64), 0, tag=9)
    await a.irecv(nxt, 1, tag=9)  # the message goes to the next receive, never the abandoned buffer
    assert nxt.tolist() == [0, 1, 2, 3] and buf.tolist() == [-1] * 4
    kept = a.irecv(buf, 1, tag=10).shield()  # opted out: the receive stays posted
    with pytest.raises(TimeoutError):
        with anyio.fail_after(0.2):
            await kept
    assert [p.op for p in a.pending()] == ["recv(peer=1, tag=10)"]
    await b.isend(np.full(4, 7, np.int64), 0, tag=10)
    await kept
    assert buf.tolist() == [7] * 4
    xs = [np.full(3, c.rank + 1.0) for c in comms]
    async with anyio.create_task_group() as tg:
        for c, x in zip(comms, xs, strict=True):
            tg.start_soon(awaited, c.all_reduce(x))
    assert all(x.tolist() == [3.0] * 3 for x in xs)
    await close_all_any(comms)


async def test_timeouts_and_errors_are_the_same_exceptions(anyio_backend):
    comms = await make_comms_any(2)
    with pytest.raises(aioccl.CollectiveTimeout, match=r"all_reduce .*seq 0.*\[1\]"):
        await comms[0].all_reduce(np.ones(4), timeout=0.3)
    with pytest.raises(aioccl.InvalidArgument, match="root 5 out of range"):
        comms[1].broadcast(np.ones(4), root=5)
    for c in comms:
        c.abort()
    with pytest.raises(aioccl.CommAborted):
        await comms[0].all_reduce(np.ones(4))


async def test_work_wait_from_a_worker_thread_and_group(anyio_backend):
    comms = await make_comms_any(2)
    xs = [np.full(5, c.rank + 1, np.int32) for c in comms]
    works = [c.all_reduce(x) for c, x in zip(comms, xs, strict=True)]
    got = [await anyio.to_thread.run_sync(w.wait, 10) for w in works]
    assert all(g.tolist() == [3] * 5 for g in got) and threading.active_count() >= 1
    ys = [np.zeros(2, np.float32) for _ in comms]
    async with anyio.create_task_group() as tg:
        for c, y in zip(comms, ys, strict=True):
            async def grouped(c=c, y=y) -> None:
                async with c.group():
                    c.isend(np.full(2, c.rank, np.float32), 1 - c.rank)
                    c.irecv(y, 1 - c.rank)
            tg.start_soon(grouped)
    assert ys[0].tolist() == [1, 1] and ys[1].tolist() == [0, 0]
    await close_all_any(comms)


async def test_inline_engine_needs_asyncio(anyio_backend):
    uid = aioccl.UniqueId.new(host="127.0.0.1")
    if anyio_backend == "trio":
        with pytest.raises(aioccl.InvalidArgument, match="engine='inline' runs on the caller's asyncio loop"):
            await aioccl.Communicator.create(uid, 0, 1, engine="inline")
    comm = await aioccl.Communicator.create(uid, 0, 1, engine="thread")
    x = np.arange(3.0)
    assert await comm.all_reduce(x) is x
    await comm.close()


def test_async_api_outside_any_loop_says_what_to_use():
    w = aioccl.work.completed("all_reduce", 0, 1)
    with pytest.raises(RuntimeError, match="init_sync"):
        w.__await__().send(None)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_trio_program_across_processes(transport):
    p = launch(3, "trio_app.py", env=TRANSPORT_ENV[transport])
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for r in range(3):
        assert f"[rank {r}] trio n=3 transport={transport} engine=thread: " in p.stdout, p.stdout[-2000:]
    assert p.stdout.count(" 0 failures") == 3


async def test_split_then_shrink_after_a_lost_rank(anyio_backend):
    comms = await make_comms_any(3, "tcp")
    subs: list[aioccl.Communicator | None] = [None] * 3

    async def split(c: aioccl.Communicator) -> None:
        subs[c.rank] = await c.split(c.rank % 2)

    async with anyio.create_task_group() as tg:
        for c in comms:
            tg.start_soon(split, c)
    assert [(s.rank, s.world_size) for s in subs] == [(0, 2), (0, 1), (1, 2)]
    xs = [np.full(3, c.rank, np.int32) for c in comms]
    async with anyio.create_task_group() as tg:
        for s, x in zip(subs, xs, strict=True):
            tg.start_soon(awaited, s.all_reduce(x))
    assert xs[0].tolist() == xs[2].tolist() == [2] * 3 and xs[1].tolist() == [1] * 3
    a, dead, b = comms
    dead.abort()
    for c in (a, b):
        with pytest.raises(aioccl.PeerLost):
            with anyio.fail_after(5):
                await c.all_reduce(np.ones(4))
    shrunk: dict[int, aioccl.Communicator] = {}

    async def shrink(c: aioccl.Communicator) -> None:
        shrunk[c.rank] = await c.shrink()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(shrink, a)
            tg.start_soon(shrink, b)
    a2, b2 = shrunk[0], shrunk[2]
    assert (a2.rank, a2.world_size, b2.rank, b2.world_size) == (0, 2, 1, 2)
    ys = [np.full(5, 3, np.int64), np.full(5, 4, np.int64)]
    async with anyio.create_task_group() as tg:
        tg.start_soon(awaited, a2.all_reduce(ys[0]))
        tg.start_soon(awaited, b2.all_reduce(ys[1]))
    assert all(y.tolist() == [7] * 5 for y in ys)
    await close_all_any([a2, b2])
