"""Every collective x every dtype x several sizes x every root, on both engine placements.

Run as: aioccl-run --nproc-per-node N tests/workers/collectives.py
The world communicator (inline engine, from the environment) runs the full
matrix; a second communicator on a proxy thread, formed from a UniqueId that
rank 0 creates and broadcasts, runs a smaller one.
"""

from __future__ import annotations

import asyncio
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import aioccl  # noqa: E402

from _check import DTYPES, Checker, data, ops_for, poison, reduced  # noqa: E402

SIZES = [0, 1, 37, 1000]
# MATRIX_DTYPES=few: one of each kind of dtype (1 and 8 bytes, signed and unsigned, both half floats, float32):
# the test runs every dtype at 3 ranks and these at the other sizes (tests/test_collectives_multiprocess.py)
FEW = [np.int8, np.uint64, np.float16, DTYPES[7], np.float32]


async def matrix(comm: aioccl.Communicator, ck: Checker, dtypes: list[type], sizes: list[int]) -> None:
    n, r = comm.world_size, comm.rank
    for dt in dtypes:
        for count in sizes:
            tag = f"{np.dtype(dt).name} count={count}"
            for op in ops_for(dt):
                want = reduced(n, count, dt, op)
                x = data(r, count, dt, op)
                out = poison(count, dt)
                got = await comm.all_reduce(x, op=op, out=out)
                ck.true(f"all_reduce {op} {tag} returns out", got is out)
                ck.same(f"all_reduce {op} {tag} out-of-place", out, want)
                ck.same(f"all_reduce {op} {tag} input intact", x, data(r, count, dt, op))
                got = await comm.all_reduce(x, op=op)
                ck.true(f"all_reduce {op} {tag} in place returns x", got is x)
                ck.same(f"all_reduce {op} {tag} in-place", x, want)
                # scan: rank r gets the reduction over ranks 0..r (avg: over those r + 1)
                pre = reduced(r + 1, count, dt, op)
                x = data(r, count, dt, op)
                out = poison(count, dt)
                got = await comm.scan(x, op=op, out=out)
                ck.true(f"scan {op} {tag} returns out", got is out)
                ck.same(f"scan {op} {tag} out-of-place", out, pre)
                ck.same(f"scan {op} {tag} input intact", x, data(r, count, dt, op))
                got = await comm.scan(x, op=op)
                ck.same(f"scan {op} {tag} in-place", x, pre)
                for root in range(n):
                    x = data(r, count, dt, op)
                    out = poison(count, dt)
                    got = await comm.reduce(x, root=root, op=op, out=out)
                    if r == root:
                        ck.same(f"reduce {op} root={root} {tag}", out, want)
                    else:
                        ck.true(f"reduce {op} root={root} {tag} returns None off-root", got is None)
                        ck.same(f"reduce {op} root={root} {tag} out untouched", out, poison(count, dt))
                    ck.same(f"reduce {op} root={root} {tag} input intact", x, data(r, count, dt, op))
                x = data(r, count, dt, op)
                got = await comm.reduce(x, root=n - 1, op=op)
                if r == n - 1:
                    ck.same(f"reduce {op} in place {tag}", got, want)
                # reduce_scatter: block `count` per rank
                full = reduced(n, n * count, dt, op)
                x = data(r, n * count, dt, op)
                out = poison(count, dt)
                await comm.reduce_scatter(x, op=op, out=out)
                ck.same(f"reduce_scatter {op} {tag}", out, full[r * count:(r + 1) * count])
                ck.same(f"reduce_scatter {op} {tag} input intact", x, data(r, n * count, dt, op))
                got = await comm.reduce_scatter(x, op=op)
                ck.same(f"reduce_scatter {op} {tag} in place", got, full[r * count:(r + 1) * count])
                ck.true(f"reduce_scatter {op} {tag} in place is a view of x",
                        count == 0 or np.shares_memory(got, x))
            everyone = [data(j, count, dt) for j in range(n)]
            for root in range(n):
                b = data(root, count, dt) if r == root else poison(count, dt)
                got = await comm.broadcast(b, root=root)
                ck.same(f"broadcast root={root} {tag}", b, data(root, count, dt))
                ck.true(f"broadcast root={root} {tag} in place", got is b)
                src = data(root, count, dt) if r == root else poison(count, dt)
                out = poison(count, dt)
                got = await comm.broadcast(src, root=root, out=out)
                ck.same(f"broadcast root={root} {tag} out-of-place", out, data(root, count, dt))
                ck.true(f"broadcast root={root} {tag} returns out", got is out)
                if r == root:
                    ck.same(f"broadcast root={root} {tag} input intact", src, data(root, count, dt))
                out = poison(n * count, dt)
                got = await comm.gather(data(r, count, dt), root=root, out=out if r == root else None)
                if r == root:
                    ck.same(f"gather root={root} {tag}", out, np.concatenate(everyone))
                else:
                    ck.true(f"gather root={root} {tag} None off-root", got is None)
                src = (np.arange(n * count) % 9).astype(dt)
                out = poison(count, dt)
                got = await comm.scatter(src if r == root else None, root=root, out=out)
                ck.same(f"scatter root={root} {tag}", out, src[r * count:(r + 1) * count])
            out = poison(n * count, dt)
            await comm.all_gather(data(r, count, dt), out=out)
            ck.same(f"all_gather {tag}", out, np.concatenate(everyone))
            got = await comm.all_gather(data(r, count, dt))
            ck.same(f"all_gather {tag} fresh out", got, np.concatenate(everyone))
            a2a = [(np.arange(n * count) + 10 * j).astype(np.int64) % 100 for j in range(n)]
            want = np.concatenate([a2a[j][r * count:(r + 1) * count] for j in range(n)]).astype(dt)
            x = a2a[r].astype(dt)
            out = poison(n * count, dt)
            await comm.all_to_all(x, out=out)
            ck.same(f"all_to_all {tag}", out, want)
            got = await comm.all_to_all(x)
            ck.same(f"all_to_all {tag} in place", x, want)
            ck.true(f"all_to_all {tag} in place returns x", got is x)
    # shapes: 2-D blocks, 0-d all_gather
    x = np.full((2, 3), r, dtype=np.float32)
    g = await comm.all_gather(x)
    ck.same("all_gather 2-D", g, np.repeat(np.arange(n, dtype=np.float32), 6).reshape(2 * n, 3))
    g = await comm.all_gather(np.float64(r) * np.ones(()))
    ck.same("all_gather 0-d", g, np.arange(n, dtype=np.float64))
    await comm.barrier()


async def registered(comm: aioccl.Communicator, ck: Checker) -> None:
    """Collectives on ``comm.alloc`` arrays (zero-copy on shared memory); odd ranks mix in plain arrays."""
    n, r = comm.world_size, comm.rank
    mine = r % 2 == 0

    def buf(count: int, dt: type) -> np.ndarray:
        return comm.alloc(count, dt) if mine else np.empty(count, dt)

    for dt in (np.float32, np.int64):
        for count in (1, 1000, 5000):
            tag = f"registered {np.dtype(dt).name} count={count}"
            want = reduced(n, count, dt, "sum")
            x = buf(count, dt)
            x[...] = data(r, count, dt, "sum")
            out = buf(count, dt)
            out[...] = poison(count, dt)
            await comm.all_reduce(x, out=out)
            ck.same(f"all_reduce {tag}", out, want)
            ck.same(f"all_reduce {tag} input intact", x, data(r, count, dt, "sum"))
            await comm.all_reduce(x)
            ck.same(f"all_reduce {tag} in place", x, want)
            x[...] = data(r, count, dt, "sum")
            out[...] = poison(count, dt)
            await comm.reduce(x, root=n - 1, out=out)
            if r == n - 1:
                ck.same(f"reduce {tag}", out, want)
            b = buf(count, dt)
            b[...] = data(0, count, dt) if r == 0 else poison(count, dt)
            await comm.broadcast(b, root=0)
            ck.same(f"broadcast {tag}", b, data(0, count, dt))
            g = buf(n * count, dt)
            g[...] = poison(n * count, dt)
            g[r * count:(r + 1) * count] = data(r, count, dt)
            await comm.all_gather(g[r * count:(r + 1) * count], out=g)
            ck.same(f"all_gather in place {tag}", g, np.concatenate([data(j, count, dt) for j in range(n)]))
            full = reduced(n, n * count, dt, "sum")
            x = buf(n * count, dt)
            x[...] = data(r, n * count, dt, "sum")
            got = await comm.reduce_scatter(x)
            ck.same(f"reduce_scatter in place {tag}", got, full[r * count:(r + 1) * count])
            a2a = buf(n * count, dt)
            a2a[...] = (np.arange(n * count) + 10 * r) % 100
            want_a2a = np.concatenate([((np.arange(n * count) + 10 * j) % 100)[r * count:(r + 1) * count]
                                       for j in range(n)]).astype(dt)
            out = buf(n * count, dt)
            await comm.all_to_all(a2a, out=out)
            ck.same(f"all_to_all {tag}", out, want_a2a)
            await comm.all_to_all(a2a)
            ck.same(f"all_to_all in place {tag}", a2a, want_a2a)


async def main() -> None:
    hosts = os.environ.get("HOSTS") == "interleaved"  # rank r on "host" r % 2: shm pairs inside, tcp across
    if hosts:
        os.environ["AIOCCL_HOSTID"] = f"host{int(os.environ['AIOCCL_RANK']) % 2}"
    comm = await aioccl.init(timeout=60)
    ck = Checker(comm.rank)
    expect = os.environ.get("EXPECT_TRANSPORT")
    if expect:
        ck.true(f"transport is {expect} (got {comm.transport})", comm.transport == expect)
    await registered(comm, ck)
    ck.true("rank and size", comm.world_size == int(os.environ["AIOCCL_WORLD_SIZE"]))
    if hosts:
        ck.true("local rank on interleaved hosts", comm.local_rank == comm.rank // 2
                and comm.local_world_size == len(range(comm.rank % 2, comm.world_size, 2)))
    else:
        ck.true("local rank", comm.local_rank == comm.rank and comm.local_world_size == comm.world_size)
    await matrix(comm, ck, FEW if os.environ.get("MATRIX_DTYPES") == "few" else DTYPES, SIZES)
    if hosts and comm.world_size > 2:  # the hierarchies ran (a host with several ranks: n > 2)
        used = {s.algo for s, _native in comm._planner.plans.values()}
        rail = "rail" in os.environ.get("AIOCCL_ALGO", "") and comm.world_size == 4  # needs equal hosts
        want = {"leader", "rail"} if rail else {"leader"}
        ck.true(f"hierarchical schedules ran: {sorted(used)}", want <= used)
    # second communicator, engine on a proxy thread, formed from a broadcast UniqueId
    uid = np.frombuffer(str(aioccl.UniqueId.new(host="127.0.0.1")).encode().ljust(128), np.uint8).copy() \
        if comm.rank == 0 else np.zeros(128, np.uint8)
    await comm.broadcast(uid, root=0)
    text = uid.tobytes().decode().strip()
    threaded = await aioccl.Communicator.create(text, comm.rank, comm.world_size, timeout=60, engine="thread")
    ck.true("proxy placement", threaded.engine_placement == "thread")
    await matrix(threaded, ck, [np.int8, np.float32, DTYPES[7]], [1, 1000])
    await threaded.close()
    await comm.close()
    ck.finish(f"collectives n={comm.world_size} algo={os.environ.get('AIOCCL_ALGO', 'auto')}")


if __name__ == "__main__":
    asyncio.run(main())
