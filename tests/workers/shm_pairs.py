"""Point-to-point and child communicators over shared-memory pairs: ``shm_pairs.py SCENARIO``.

Prints ``OK <rank> <what>`` per check that passed; any failure raises (non-zero exit).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import numpy as np

import aioccl
from aioccl.algorithms.schedule import IN, OUT, SCRATCH, Fetch, RecvReduce, Region, Schedule, Send, Src, Stage, Step

SIZES = [0, 1, 2, 16383, 16384, 3 * 16384 + 7, 5 << 18]  # int32 elements; the test's ring holds 64 KiB


def data(src: int, dst: int, n: int) -> np.ndarray:
    return ((np.arange(n, dtype=np.int64) * 7 + 1000 * src + dst) % 100_003).astype(np.int32)


async def p2p(comm: aioccl.Communicator) -> None:
    r, n = comm.rank, comm.world_size
    assert all(comm.transport_to(p) == ("self" if p == r else "shm") for p in range(n)), comm.transport
    for size in SIZES:
        got = {p: np.full(size, -7, np.int32) for p in range(n) if p != r}  # poisoned
        recvs = [comm.irecv(got[p], p, tag=size % 1000) for p in got]
        sends = [comm.isend(data(r, p, size), p, tag=size % 1000) for p in got]
        await asyncio.gather(*recvs, *sends)  # every rank sends to every other at once: no deadlock
        for p, buf in got.items():
            bad = np.flatnonzero(buf != data(p, r, size))
            assert bad.size == 0, (size, p, bad[:5])
    print(f"OK {r} p2p {len(SIZES)} sizes, {comm._engine.mailbox.rdv.read_in_place} read in place", flush=True)


async def withdrawn(comm: aioccl.Communicator) -> None:
    """A large send offered for an in-place read passes its deadline before the receive is posted: the
    send fails with a timeout, the late receive fails at once naming the sender (never reading a buffer
    the sender has handed back), and the pair carries the next message intact."""
    big = 1 << 20  # int32: 4 MiB, by rendezvous
    if comm.rank == 0:
        x = data(0, 1, big)
        t0 = time.monotonic()
        try:
            await comm.isend(x, 1, tag=3, timeout=0.5)
            raise AssertionError("the send was never received: it must time out")
        except aioccl.CollectiveTimeout as e:
            assert e.waiting_for == [1] and time.monotonic() - t0 < 3, (e, time.monotonic() - t0)
        x[:] = -1  # the buffer is the user's again
        await comm.isend(data(0, 1, big), 1, tag=4)
    else:
        await asyncio.sleep(1.5)
        got = np.full(big, -7, np.int32)
        t0 = time.monotonic()
        try:
            await comm.irecv(got, 0, tag=3, timeout=10)
            raise AssertionError(f"a withdrawn message was received: {np.unique(got)[:5]}")
        except aioccl.AiocclError as e:
            assert "withdrew" in str(e) and "rank 0" in str(e) and time.monotonic() - t0 < 3, e
        assert (got == -7).all(), "a withdrawn message must leave the receive buffer as it was"
        await comm.irecv(got, 0, tag=4)
        assert (got == data(0, 1, big)).all()
    print(f"OK {comm.rank} withdrawn", flush=True)


def reference(coll: str, count: int, n: int, me: int) -> np.ndarray:
    """What ``coll`` gives rank ``me`` of ``n`` when rank j's input is ``inputs(j)`` (exact by construction)."""
    ins = [inputs(coll, count, n, j) for j in range(n)]
    if coll == "all_reduce":
        return np.sum(ins, axis=0, dtype=np.int64)
    if coll == "all_gather":
        return np.concatenate(ins)
    if coll == "reduce_scatter":
        return np.sum(ins, axis=0, dtype=np.int64)[me * count:(me + 1) * count]
    assert coll == "all_to_all"
    return np.concatenate([x[me * count:(me + 1) * count] for x in ins])


def inputs(coll: str, count: int, n: int, j: int) -> np.ndarray:
    total = count if coll in ("all_reduce", "all_gather") else count * n
    return (np.arange(total, dtype=np.int64) * 3 + 11 * j) % 1009


async def run_children_ops(c: aioccl.Communicator, tag: str) -> None:
    """Every block-wise op and all_reduce on child ``c``, bit-exact, on the flat and the direct sizes."""
    n, me = c.world_size, c.rank
    for coll in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        for count in (1, 1000, 3 << 18):
            x = inputs(coll, count, n, me)
            out_len = {"all_reduce": count, "all_gather": count * n, "reduce_scatter": count}.get(coll, count * n)
            out = np.full(out_len, -5, np.int64)  # poisoned
            await getattr(c, coll)(x, out=out)
            bad = np.flatnonzero(out != reference(coll, count, n, me))
            assert bad.size == 0, (tag, coll, count, bad[:5])
    b = np.arange(5000, dtype=np.float32) if me == 0 else np.full(5000, -1.0, np.float32)
    await c.broadcast(b, root=0)
    assert (b == np.arange(5000, dtype=np.float32)).all(), tag


async def children(comm: aioccl.Communicator) -> None:
    """``split`` children run over their own shared-memory channel (the world's algorithms), alongside
    the world's ops, and a mismatch on one is caught on every member."""
    r, n = comm.rank, comm.world_size
    sub = await comm.split(0, key=-r)
    half = await comm.split(r % 2)
    assert sub is not None and sub.rank == n - 1 - r and sub.transport == "shm", (sub, sub and sub.transport)
    assert sub._state.shm is not None and sub._state.shm is not comm._state.shm, "the child has a channel of its own"
    assert half is not None and (half.world_size == 1 or half._state.shm is not None)
    await run_children_ops(sub, "split(0, key=-rank)")
    await run_children_ops(half, "split(rank % 2)")
    assert sub._state.shm.counts()["ops"] >= 13, sub._state.shm.counts()
    # the world and a child at once: one doorbell wakes both channels
    w, s = np.full(1 << 20, r + 1, np.int64), np.full(1 << 20, 2 * r, np.int64)
    ws, ss = comm.all_reduce(w), sub.all_reduce(s)
    await asyncio.gather(ws, ss)
    assert (w == n * (n + 1) // 2).all() and (s == n * (n - 1)).all()
    try:
        await sub.reduce(np.ones(10, np.int32), root=sub.rank)  # every rank names itself the root
    except aioccl.CollectiveMismatch as e:
        print(f"OK {r} child mismatch seq {e.seq}", flush=True)
    x = np.full(1000, r + 1, np.int64)
    await sub.all_reduce(x)
    assert (x == n * (n + 1) // 2).all(), "the child is usable after a mismatch"
    await half.close()
    await sub.close()
    assert sub._state.shm.closed
    print(f"OK {r} children", flush=True)


async def shrunk(comm: aioccl.Communicator) -> None:
    """The survivors of a killed rank shrink to a communicator that runs over shared memory again."""
    await comm.barrier()
    if comm.rank == comm.world_size - 1:
        await asyncio.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        await comm.all_reduce(np.ones(1000, np.float32), timeout=30)
        raise AssertionError("the all_reduce survived a killed rank")
    except aioccl.PeerLost:
        pass
    new = await comm.shrink(timeout=30)
    assert new.transport == "shm" and new._state.shm is not None, new.transport
    await run_children_ops(new, "shrunk")
    print(f"OK {new.rank} shrunk to {new.world_size} over {new.transport}", flush=True)
    await new.close()


async def peer_killed(comm: aioccl.Communicator) -> None:
    """Rank 1 waits in a receive from rank 2, which dies: PeerLost(2) at once, not at the deadline."""
    await comm.barrier()
    if comm.rank == 2:
        await asyncio.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)
    if comm.rank == 1:
        t0 = time.monotonic()
        try:
            await comm.irecv(np.empty(10, np.int32), 2, timeout=60)
        except aioccl.PeerLost as e:
            assert e.rank == 2 and time.monotonic() - t0 < 5.0, (e, time.monotonic() - t0)
            print(f"OK 1 lost {e.rank} after {time.monotonic() - t0:.2f}s", flush=True)
    await asyncio.sleep(0.5)
    comm.abort()


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


async def sent_before_posted(comm: aioccl.Communicator, count: int, elems: int, tag: int, sleep_s: float,
                             what: str) -> None:
    """Rank 0 sends ``count`` x ``elems`` int32 before rank 1 posts anything; rank 1 sleeps ``sleep_s``, then
    receives them all in order, and says how much it grew while they were unposted."""
    await comm.barrier()
    if comm.rank == 0:
        msgs = [np.full(elems, i, np.int32) for i in range(count)]
        t0 = time.monotonic()
        await asyncio.gather(*(comm.isend(m, 1, tag=tag) for m in msgs))
        print(f"OK 0 sent {count}{what} after {time.monotonic() - t0:.2f}s", flush=True)
    else:
        before = rss_mib()
        await asyncio.sleep(sleep_s)  # the sender has issued everything by now
        grown = rss_mib() - before
        buf = np.empty(elems, np.int32)
        for i in range(count):
            buf[:] = -1
            await comm.irecv(buf, 0, tag=tag)
            assert (buf == i).all(), (i, np.unique(buf)[:5])
        print(f"OK 1{what} backlog {count} intact, grew {grown:.0f} MiB while unposted", flush=True)
    await comm.barrier()


async def backlog(comm: aioccl.Communicator) -> None:
    """MESSAGES x 4 MiB (rendezvous): rank 1's memory must not grow by them."""
    await sent_before_posted(comm, int(os.environ.get("BACKLOG_MESSAGES", "40")), 1 << 20, 5, 1.0, "")


async def eager_backlog(comm: aioccl.Communicator) -> None:
    """MESSAGES x 256 KiB (eager), rank 1 asleep past AIOCCL_PEER_TIMEOUT: the budget holds rank 1's
    memory, and the paused connection stays alive."""
    await sent_before_posted(comm, int(os.environ.get("BACKLOG_MESSAGES", "400")), 1 << 16, 6, 3.0, " eager")


async def bcast_ahead(comm: aioccl.Communicator) -> None:
    """The root broadcasts MESSAGES x 1 MiB while rank 1 sleeps: the root is held back, not rank 1's memory."""
    count = int(os.environ.get("BACKLOG_MESSAGES", "150"))
    await comm.barrier()
    before = rss_mib()
    if comm.rank == 1:
        await asyncio.sleep(3.0)
    grown = rss_mib() - before
    buf = np.empty(1 << 18, np.int32)
    for i in range(count):
        if comm.rank == 0:
            buf[:] = i
        else:
            buf[:] = -1
        await comm.broadcast(buf, root=0)
        assert (buf == i).all(), (i, np.unique(buf)[:5])
    print(f"OK {comm.rank} broadcast ahead {count} intact, grew {grown:.0f} MiB while asleep", flush=True)
    await comm.barrier()


def mixed_schedule(me: int, n: int, k: int) -> Schedule:
    """Shared-memory steps and message steps in one schedule (what a hierarchical algorithm is):
    fetch my left's IN from its slot; add it again, sent as a message; fetch my right's result."""
    left, right = (me - 1) % n, (me + 1) % n
    a, b, tmp = Region(IN, 0, k), Region(OUT, 0, k), Region(SCRATCH, 0, k)
    return Schedule((
        Step(stage=(Stage(a, 0),), wait=(left,), reads=(Fetch(Src(left, a, 0), b),), lockstep=True),
        Step(sends=(Send(right, a),), recvs=(RecvReduce(left, b, b, tmp),)),
        Step(stage=(Stage(b, 0),), wait=(right,), reads=(Fetch(Src(right, b, 0), Region(OUT, k, 2 * k)),),
             lockstep=True),
    ), scratch=k, algo="mixed")


async def mixed(comm: aioccl.Communicator) -> None:
    """The one executor runs a schedule mixing both kinds of step on the communicator's channel, in issue
    order with ordinary ops, bit-exact."""
    me, n = comm.rank, comm.world_size
    assert comm._state.shm is not None, comm.transport

    def mine(j: int, k: int) -> np.ndarray:
        return (np.arange(k, dtype=np.int64) * 5 + 100 * j + 1) % 9973

    for k in (1, 1000, 100_000):
        out = np.full(2 * k, -7, np.int64)  # poisoned
        ref = np.full(k, 3, np.int64)
        works = [comm._launcher.launch("all_reduce", mixed_schedule(me, n, k), mine(me, k), out, aioccl.ReduceOp.SUM,
                              2 * k, 0, 30.0, lambda: None),
                 comm.all_reduce(ref)]
        await asyncio.gather(*works)
        assert (out[:k] == 2 * mine((me - 1) % n, k)).all() and (out[k:] == 2 * mine(me, k)).all(), k
        assert (ref == 3 * n).all(), k
    print(f"OK {me} mixed schedule on the channel", flush=True)


async def coll_offers(comm: aioccl.Communicator) -> None:
    """Collectives forced onto the pairs' messages (AIOCCL_ALGO=ring/chain): their large messages go as
    offers the peer reads in place; every result exact, the late rank's timed-out op never reads a buffer
    its peer has handed back."""
    r, n = comm.rank, comm.world_size
    for count in (1 << 16, 3 << 18, (1 << 20) + 5):  # int64: 512 KiB to 8 MiB
        x = (np.arange(count, dtype=np.int64) % 1009) * (r + 1)
        out = np.full(count, -1, np.int64)
        await comm.all_reduce(x, out=out)
        assert (out == (np.arange(count) % 1009) * (n * (n + 1) // 2)).all(), count
        g = await comm.all_gather(np.full(count // n, r, np.int64))
        assert (g == np.repeat(np.arange(n), count // n)).all(), count
        b = x.copy() if r == n - 1 else np.zeros(count, np.int64)
        await comm.broadcast(b, root=n - 1)
        assert (b == (np.arange(count) % 1009) * n).all(), count
    print(f"OK {r} coll_offers, {comm._engine.mailbox.rdv.read_in_place} read in place", flush=True)


async def coll_withdrawn(comm: aioccl.Communicator) -> None:
    """Rank 0's all_reduce offers its half and passes its deadline before rank 1 even calls: it withdraws the
    offer and overwrites its buffer; rank 1's late call fails at once (the timeout's notice), never reading
    it; the next all_reduce is exact."""
    big = 1 << 20  # int64: 8 MiB, halves of 4 MiB by offer
    if comm.rank == 0:
        x = np.arange(big, dtype=np.int64)
        try:
            await comm.all_reduce(x, timeout=0.5)
            raise AssertionError("rank 1 was not there: the all_reduce must time out")
        except aioccl.CollectiveTimeout as e:
            assert e.waiting_for == [1], e
        x[:] = -1  # the buffer is the user's again
    else:
        await asyncio.sleep(1.5)
        y = np.arange(big, dtype=np.int64)
        t0 = time.monotonic()
        try:
            await comm.all_reduce(y, timeout=10)
            raise AssertionError("the op rank 0 gave up completed here")
        except aioccl.AiocclError as e:
            assert time.monotonic() - t0 < 2, (e, time.monotonic() - t0)
    z = np.full(big, comm.rank + 1, np.int64)
    await comm.all_reduce(z)
    assert (z == 3).all()
    print(f"OK {comm.rank} coll_withdrawn", flush=True)


async def main() -> None:
    comm = await aioccl.init(timeout=60, engine=os.environ.get("SHM_PAIRS_ENGINE", "auto"))
    await globals()[sys.argv[1]](comm)
    if sys.argv[1] not in ("peer_killed", "shrunk"):
        await comm.close()


asyncio.run(main())
