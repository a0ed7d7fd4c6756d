"""Semantics with several communicators in one program (real loopback sockets, shared memory, ib loopback).

Run by anyio's pytest plugin on asyncio (engine inline) and on trio (engine on a proxy thread); the few
tests about asyncio itself (another loop, blocking on the inline engine's own loop) run on asyncio only.
"""

from __future__ import annotations

import asyncio

import anyio
import numpy as np
import pytest

import aioccl

from conftest import close_all_any, gather_any, make_comms_any

pytestmark = pytest.mark.anyio
ASYNCIO_ONLY = pytest.mark.parametrize("anyio_backend", ["asyncio"])


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param


@pytest.fixture(params=["tcp", "shm", "ib"])
async def comms3(request, anyio_backend):
    """Three communicators in this program, over sockets, shared memory, or ib on its loopback backend."""
    comms = await make_comms_any(3, transport=request.param)
    yield comms
    await close_all_any(comms)


async def test_p2p_tags_fifo_and_out_of_order(comms3):
    a, b, _ = comms3
    # two messages with the same tag arrive in send order; a different tag is independent
    first, second, other = np.zeros(4), np.zeros(4), np.zeros(2, np.int32)
    r_other = b.irecv(other, 0, tag=5)
    r1, r2 = b.irecv(first, 0, tag=1), b.irecv(second, 0, tag=1)
    await gather_any(a.isend(np.full(4, 1.0), 1, tag=1), a.isend(np.full(4, 2.0), 1, tag=1),
                         a.isend(np.arange(2, dtype=np.int32), 1, tag=5))
    assert await r1 is first and await r2 is second and await r_other is other
    assert (first == 1).all() and (second == 2).all() and (other == [0, 1]).all()


async def test_send_before_recv_is_buffered_and_self_send(comms3):
    a, b, _ = comms3
    await a.isend(np.arange(100, dtype=np.int64), 1, tag=3)  # completes with no receive posted
    buf = np.full(100, -1, np.int64)
    await b.irecv(buf, 0, tag=3)
    assert (buf == np.arange(100)).all()
    mine = np.zeros(3)
    r = a.irecv(mine, 0, tag=4)
    await a.isend(np.ones(3), 0, tag=4)
    await r
    assert (mine == 1).all()


async def test_cancel_unmatched_recv_passes_message_to_next(comms3):
    a, b, _ = comms3
    x, y = np.zeros(2), np.zeros(2)
    w = b.irecv(x, 0, tag=7)
    await anyio.sleep(0.01)
    assert w.cancel() and w.cancelled()
    with pytest.raises(aioccl.OpCancelled, match=r"recv\(peer=0, tag=7\) \(seq 7\) was withdrawn by work.cancel"):
        await w
    w2 = b.irecv(y, 0, tag=7)
    await a.isend(np.full(2, 5.0), 1, tag=7)
    await w2
    assert (y == 5).all() and (x == 0).all()
    # a collective is a promise to the peers: never cancelled locally
    works = [c.barrier() for c in comms3]
    assert not works[0].cancel()
    await gather_any(*works)


async def test_many_concurrent_ops_from_many_tasks(comms3):
    async def worker(comm: aioccl.Communicator, k: int) -> None:
        # every rank issues the same collectives in the same order per communicator
        xs = [np.full(50 + i, comm.rank + i, np.int64) for i in range(20)]
        works = [comm.all_reduce(x) for x in xs]
        peer = (comm.rank + 1) % 3
        bufs = [np.zeros(10, np.int32) for _ in range(10)]
        recvs = [comm.irecv(bufs[t], (comm.rank - 1) % 3, tag=100 + t) for t in range(10)]
        sends = [comm.isend(np.full(10, t, np.int32), peer, tag=100 + t) for t in range(10)]
        await gather_any(*works, *recvs, *sends)
        for i, x in enumerate(xs):
            assert (x == sum(r + i for r in range(3))).all()
        for t, buf in enumerate(bufs):
            assert (buf == t).all()

    await gather_any(*(worker(c, 0) for c in comms3))


async def test_group_launches_together_and_awaits_all(comms3):
    outs = {c.rank: [np.zeros(1, np.int64) for _ in range(3)] for c in comms3}

    async def exchange(c: aioccl.Communicator) -> list[aioccl.Work]:
        async with c.group():
            ws = [c.isend(np.array([10 * c.rank + j]), j, tag=1) for j in range(3)]
            ws += [c.irecv(outs[c.rank][j], j, tag=1) for j in range(3)]
            assert not any(w.done() for w in ws)  # nothing starts before the group ends
        return ws

    for ws in await gather_any(*(exchange(c) for c in comms3)):
        assert all(w.done() and w.exception() is None for w in ws)
    for r in range(3):
        assert [int(o[0]) for o in outs[r]] == [10 * j + r for j in range(3)]


async def test_split_forms_independent_communicators(anyio_backend):
    comms = await make_comms_any(4)
    try:
        if anyio_backend == "asyncio":
            with pytest.raises(RuntimeError, match="on the engine.s thread"):
                comms[0].split(0).wait()  # inline engine: waiting on its own loop must fail loudly, not hang
            await gather_any(*(c.split(0) for c in comms[1:]))
        subs = await gather_any(*(c.split(c.rank % 2 if c.rank != 3 else None, key=-c.rank) for c in comms))
        assert subs[3] is None
        evens = [subs[0], subs[2]]
        assert sorted(s.rank for s in evens) == [0, 1] and subs[2].rank == 0  # key=-rank reverses order
        assert subs[1].world_size == 1 and subs[0].world_size == 2
        xs = [np.full(3, c.rank, np.float32) for c in comms]
        await gather_any(evens[0].all_reduce(xs[0]), evens[1].all_reduce(xs[2]), subs[1].all_reduce(xs[1]))
        assert (xs[0] == 2).all() and (xs[2] == 2).all() and (xs[1] == 1).all()
        got = await gather_any(*(s.all_gather(np.array([s.rank])) for s in evens))
        assert all((g == [0, 1]).all() for g in got)
        await gather_any(*(s.close() for s in subs if s is not None))
        # the parent still works after its children closed
        ys = [np.ones(2, np.int32) for _ in comms]
        await gather_any(*(c.all_reduce(y) for c, y in zip(comms, ys, strict=True)))
        assert all((y == 4).all() for y in ys)
    finally:
        await close_all_any(comms)


@ASYNCIO_ONLY
@pytest.mark.parametrize("engine", ["inline", "thread"])
async def test_work_awaitable_from_another_loop_and_thread(engine, anyio_backend):
    comms = await make_comms_any(2, engine=engine)
    try:
        xs = [np.ones(8, np.float64) for _ in comms]
        works = [c.all_reduce(x) for c, x in zip(comms, xs, strict=True)]
        if engine == "thread":
            # awaited on a different loop in a different thread, and waited with a blocking call
            res = await asyncio.to_thread(lambda: asyncio.run(_await(works[0])))
            assert res is xs[0]
            assert works[1].wait(timeout=10) is xs[1]
        else:
            assert await works[0] is xs[0] and await works[1] is xs[1]
            with pytest.raises(RuntimeError, match="on the engine.s thread"):
                comms[0].all_reduce(np.ones(1)).wait()
            await comms[1].all_reduce(np.ones(1))
        assert all((x == 2).all() for x in xs)
        seen = []
        w = comms[0].barrier()
        w.add_done_callback(seen.append)
        await gather_any(w, comms[1].barrier())
        assert seen == [w] and w.result() is None and w.exception() is None
    finally:
        await close_all_any(comms)


async def _await(w: aioccl.Work):
    return await w


async def test_context_manager_and_jax_like_immutable_inputs(comms3):
    x = np.arange(4.0)
    x.flags.writeable = False
    with pytest.raises(aioccl.InvalidArgument, match="read-only"):
        comms3[0].all_reduce(x)
    outs = [np.zeros(4) for _ in comms3]
    await gather_any(*(c.all_reduce(x, out=o) for c, o in zip(comms3, outs, strict=True)))
    assert all((o == 3 * np.arange(4.0)).all() for o in outs)


async def test_async_with_closes(anyio_backend):
    comms = await make_comms_any(2)

    async def use(c: aioccl.Communicator) -> None:
        async with c:
            await c.barrier()

    await gather_any(*(use(c) for c in comms))
    with pytest.raises(aioccl.CommAborted, match="closed"):
        comms[0].barrier()
    more = await make_comms_any(1)
    if anyio_backend == "asyncio":
        with pytest.raises(RuntimeError, match="on the engine.s thread"):
            more[0].close().wait()  # close() on the inline engine's own loop: await it, never wait()
    await more[0].close()


async def test_cancelling_the_awaiter_does_not_cancel_the_op():
    comms = await make_comms_any(2)
    try:
        x0, x1 = np.ones(4), np.full(4, 2.0)
        w = comms[0].all_reduce(x0)
        with pytest.raises(TimeoutError):
            with anyio.fail_after(0.05):
                await w  # rank 1 has not joined yet: the awaiter gives up
        assert not w.done()
        await comms[1].all_reduce(x1)  # the op was never cancelled: it completes now
        assert await w is x0 and (x0 == 3).all() and (x1 == 3).all()
    finally:
        await close_all_any(comms)
