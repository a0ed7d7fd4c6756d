"""Pure pieces, no sockets: ids, handshake, interface specs, environment, frames, tuning, pool, Work."""

from __future__ import annotations

import asyncio
import os
import threading

import numpy as np
import pytest

import aioccl
from aioccl import environment
from aioccl.bootstrap import auth, netif
from aioccl.engine.pool import BufferPool
from aioccl.errors import BootstrapError
from aioccl.transport.frames import COLL, KIND_NAMES, Header, unpack
from aioccl.tuning import Tuning


def test_unique_id_round_trips():
    uid = aioccl.UniqueId("10.1.2.3", 29500, bytes(range(16)))
    assert aioccl.UniqueId.parse(str(uid)) == uid
    v6 = aioccl.UniqueId("::1", 5, b"\xff" * 16)
    assert str(v6).startswith("[::1]:5/") and aioccl.UniqueId.parse(str(v6)) == v6
    for bad in ["", "host/abc", "h:99999/" + "00" * 16, "h:1/" + "00" * 3]:
        with pytest.raises(aioccl.InvalidArgument):
            aioccl.UniqueId.parse(bad)


def test_handshake_protocol_accepts_the_secret_only():
    secret = b"s" * 16
    nonce_s, challenge = auth.challenge()
    nonce_c, reply = auth.answer(secret, challenge)
    proof = auth.verify_answer(secret, nonce_s, reply)
    auth.verify_proof(secret, nonce_s, nonce_c, proof)
    _, wrong = auth.answer(b"x" * 16, challenge)
    with pytest.raises(auth.AuthError):
        auth.verify_answer(secret, nonce_s, wrong)
    with pytest.raises(auth.AuthError):
        auth.verify_answer(secret, nonce_s, b"GET / HTTP/1.1\r\n" * 4)
    with pytest.raises(auth.AuthError):
        auth.answer(secret, b"garbage")
    with pytest.raises(auth.AuthError):
        auth.verify_proof(secret, nonce_s, nonce_c, bytes(32))


def test_ifname_spec_like_nccl():
    assert netif.matches("eth0", "eth") and not netif.matches("ib0", "eth")
    assert not netif.matches("docker0", "^docker,lo") and netif.matches("eth1", "^docker,lo")
    assert netif.matches("eth0", "=eth0") and not netif.matches("eth01", "=eth0")
    assert ("lo", "127.0.0.1") in netif.ipv4_interfaces()
    assert netif.pick_by_name("=lo") == "127.0.0.1"
    assert netif.route_to("127.0.0.1", 1) == "127.0.0.1"
    with pytest.raises(BootstrapError):
        netif.pick_by_name("=nosuchif0")


@pytest.mark.parametrize("env,want", [
    ({"AIOCCL_RANK": "2", "AIOCCL_WORLD_SIZE": "4", "AIOCCL_LOCAL_RANK": "1", "AIOCCL_COMM_ID": "h:7",
      "AIOCCL_COMM_SECRET": "ab" * 16}, (2, 4, 1, "h", 7, "aioccl", False)),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "m", "MASTER_PORT": "100"},
     (1, 2, 1, "m", 100, "torchrun", True)),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "m", "MASTER_PORT": "100",
      "TORCHELASTIC_USE_AGENT_STORE": "True"}, (0, 2, 0, "m", 101, "torchrun", True)),
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "3",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, (3, 4, 3, "127.0.0.1", None, "mpi", True)),
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODELIST": "gpu[07-09],x",
      "SLURM_JOB_ID": "123"}, (5, 8, 1, "gpu07", 20123, "slurm", True)),
])
def test_launcher_environments(env, want):
    le = environment.read(env)
    got = (le.rank, le.world_size, le.local_rank, le.host, le.port if want[4] is not None else None,
           le.source, le.weak_secret)
    assert got == want and len(le.secret) == 16
    assert environment.read(env).secret == le.secret  # every rank derives the same secret


def test_environment_errors_are_clear():
    with pytest.raises(BootstrapError, match="no launcher environment"):
        environment.read({})
    with pytest.raises(BootstrapError, match="out of range"):
        environment.read({"AIOCCL_RANK": "4", "AIOCCL_WORLD_SIZE": "4", "AIOCCL_COMM_ID": "h:1"})
    with pytest.raises(BootstrapError, match="root address"):
        environment.read({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4",
                          "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})


def test_frame_header_round_trip():
    h = Header(COLL, 3, 9, 7, 2**63 - 1, 12345, 1 << 40, count=1 << 38, root=5, redop=2)
    assert unpack(h.pack()) == h and len(h.pack()) == 48
    assert h.fingerprint() == (3, 9, 2, 1 << 38, 5)
    with pytest.raises(ValueError, match="unknown kind"):
        unpack(bytes([max(KIND_NAMES) + 1]) + bytes(47))
    with pytest.raises(ValueError, match="payload bytes"):
        unpack(Header(COLL, 1, 1, 0, 1, 0, 1 << 50).pack())


def test_tuning_by_size_and_override():
    t = Tuning.from_env({})
    assert t.choose("all_reduce", 2, 4, 4)[0] == "rd" and t.choose("all_reduce", 1 << 24, 4, 4)[0] == "ring"
    assert t.choose("broadcast", 2, 4, 8)[0] == "tree" and t.choose("broadcast", 1 << 26, 4, 8)[0] == "chain"
    t = Tuning.from_env({"AIOCCL_ALGO": "all_reduce:ring", "AIOCCL_BUFFSIZE": "1024"})
    assert t.choose("all_reduce", 2, 4, 4) == ("ring", 256) and t.choose("reduce", 2, 4, 4)[0] == "tree"
    assert Tuning.from_env({"AIOCCL_ALGO": "tree"}).choose("all_reduce", 1 << 24, 4, 4)[0] == "rd"
    for bad in ({"AIOCCL_BUFFSIZE": "lots"}, {"AIOCCL_TUNE_LINK": "carrier-pigeon"}):
        with pytest.raises(aioccl.InvalidArgument):
            Tuning.from_env(bad)


def test_pool_reuses_buffers():
    pool = BufferPool()
    a = pool.acquire(5000)
    pool.release(a)
    b = pool.acquire(6000)
    assert b is a and pool.allocated_bytes == 8192
    pool.release(b)
    for _ in range(1000):
        pool.release(pool.acquire(7000))
    assert pool.allocated_bytes == 8192


async def test_work_from_threads_and_loops():
    w = aioccl.Work("x", 1)
    calls = []
    w.add_done_callback(calls.append)
    assert not w.done()
    with pytest.raises(asyncio.InvalidStateError):
        w.result()
    threading.Timer(0.05, lambda: w._set_result(42)).start()
    assert await w == 42 and calls == [w] and w.wait(0) == 42
    e = aioccl.Work("y", 2)
    threading.Timer(0.05, lambda: e._set_exception(aioccl.PeerLost(3))).start()
    with pytest.raises(aioccl.PeerLost):
        await asyncio.to_thread(e.wait, 5)
    with pytest.raises(TimeoutError):
        aioccl.Work("z", 3).wait(timeout=0.01)
    c = aioccl.Work("recv", 4, cancellable=True)
    assert c.cancel() and c.cancelled() and not c._start()
    assert not aioccl.Work("coll", 5).cancel()


def test_supported_dtypes_cover_the_contract():
    names = {np.dtype(d).name for d in aioccl.SUPPORTED_DTYPES}
    assert names == {"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32",
                     "float64"}


def test_shm_tuner_picks_by_size_and_ranks_and_obeys_overrides():
    t = Tuning.from_env({})
    assert t.choose_shm("all_reduce", 2 << 20, 4, 2) == "flat"  # 8 MiB at 2 ranks
    assert t.choose_shm("all_reduce", (2 << 20) + 1, 4, 2) == "direct"
    assert t.choose_shm("all_reduce", 32 << 10, 4, 4) == "flat"  # 128 KiB at 4 ranks
    assert t.choose_shm("all_reduce", (32 << 10) + 1, 4, 4) == "direct"
    assert t.choose_shm("reduce", 64 << 10, 4, 4) == "direct"
    assert t.choose_shm("all_gather", 1, 4, 4) == "direct" and t.choose_shm("barrier", 0, 1, 4) == "direct"
    flat = Tuning.from_env({"AIOCCL_ALGO": "flat"})
    assert flat.choose_shm("all_reduce", 1 << 24, 4, 2) == "flat"
    # a socket algorithm forced: that collective leaves shared memory, the others stay
    ring = Tuning.from_env({"AIOCCL_ALGO": "all_reduce:ring"})
    assert ring.choose_shm("all_reduce", 8, 4, 2) is None and ring.choose_shm("broadcast", 8, 4, 2) == "direct"
    assert Tuning.from_env({"AIOCCL_ALGO": "tree"}).choose_shm("broadcast", 8, 4, 2) is None


def test_heap_first_fit_and_coalescing():
    from aioccl.transport.shm.heap import ALIGN, Heap

    h = Heap(4096, 16 * ALIGN)
    a, b, c = h.alloc(1), h.alloc(ALIGN + 1), h.alloc(ALIGN)
    assert (a, b, c) == (4096, 4096 + ALIGN, 4096 + 3 * ALIGN)
    h.free(b)
    assert h.alloc(2 * ALIGN) == b  # first fit reuses the hole
    h.free(a)
    h.free(b)
    h.free(c)
    assert h.free_bytes() == 16 * ALIGN and h.used_blocks() == 0
    assert h.alloc(16 * ALIGN) == 4096  # everything coalesced back into one block
    with pytest.raises(MemoryError, match="AIOCCL_SHM_HEAP"):
        h.alloc(1)


def test_shm_settings_parse_and_reject():
    from aioccl.engine.shm.setup import settings

    s = settings({"AIOCCL_SHM_DISABLE": "1", "AIOCCL_SHM_BUFFSIZE": "10000"})
    assert s["disabled"] and s["half"] == 9984
    assert not settings({})["disabled"] and not settings({"AIOCCL_SHM_DISABLE": "0"})["disabled"]
    for bad in ({"AIOCCL_SHM_BUFFSIZE": "big"}, {"AIOCCL_SHM_BUFFSIZE": "100"}, {"AIOCCL_SHM_HEAP": "-1"}):
        with pytest.raises(aioccl.InvalidArgument):
            settings(bad)


def test_a_waiting_rank_spins_yielding_by_default_and_purely_only_when_asked_and_there_is_a_core_to_spare():
    from aioccl.transport.shm.segment import wait_policy

    cpus = len(os.sched_getaffinity(0))
    assert wait_policy({"AIOCCL_SHM_SPIN_US": "5"}, 2) == (pytest.approx(5e-6), True)
    assert wait_policy({}, cpus + 1) == (pytest.approx(100e-6), True)  # yielding, a spin costs the peer nothing
    assert wait_policy({"AIOCCL_SHM_YIELD": "0"}, 1) == (pytest.approx(100e-6), False)
    assert wait_policy({"AIOCCL_SHM_YIELD": "0"}, cpus + 1) == (0.0, True)  # no core to spare: never spin
    with pytest.raises(aioccl.InvalidArgument, match="AIOCCL_SHM_SPIN_US"):
        wait_policy({"AIOCCL_SHM_SPIN_US": "x"}, 2)


def test_numeric_knobs_parse_one_way():
    from aioccl.envvars import env_float, env_int

    assert env_int({}, "K", 7, 0) == 7 and env_int({"K": " 12 "}, "K", 7, 0) == 12
    assert env_float({"K": ""}, "K", 2.0) == 2.0 and env_float({"K": "0.5"}, "K", 2.0, low=0.5) == 0.5
    with pytest.raises(aioccl.InvalidArgument, match=r"^K='x' is not an integer$"):
        env_int({"K": "x"}, "K", 7, 0)
    with pytest.raises(aioccl.InvalidArgument, match=r"^K must be within \[0, 3\], got 4$"):
        env_int({"K": "4"}, "K", 7, 0, 3)
    with pytest.raises(aioccl.InvalidArgument, match=r"^K='x' is not a number of seconds$"):
        env_float({"K": "x"}, "K", 1.0, unit="seconds")
    with pytest.raises(aioccl.InvalidArgument, match=r"^K must be greater than 0 seconds, got '0'$"):
        env_float({"K": "0"}, "K", 1.0, low=0, exclusive=True, unit="seconds")
    with pytest.raises(aioccl.InvalidArgument, match=r"^K must be at least 1 seconds, got '0.5'$"):
        env_float({"K": "0.5"}, "K", 1.0, low=1, unit="seconds")


def test_the_pool_gives_memory_back_after_a_burst():
    from aioccl.engine.pool import BufferPool

    pool = BufferPool(idle_cap=8 << 20)
    burst = [pool.acquire(1 << 20) for _ in range(100)]
    for b in burst:
        pool.release(b)
    assert pool.idle_bytes <= 8 << 20 and pool.dropped_bytes >= 92 << 20
    again = pool.acquire(1 << 20)  # steady state still reuses: no new allocation
    assert pool.allocated_bytes == 100 << 20 and again.size == 1 << 20
    big = pool.acquire(64 << 20)  # a class larger than the cap keeps one idle buffer
    pool.release(big)
    assert pool.acquire(64 << 20) is big


def test_the_unexpected_budget_pauses_a_peer_and_resumes_below_half():
    from aioccl.engine.receives import Budget

    calls = []
    b = Budget(10)
    b.pause = lambda peer, paused: calls.append((peer, paused))
    b.hold(3, 6)
    b.hold(3, 6)  # 12 > 10: paused once
    b.hold(3, 1)
    b.hold(4, 2)
    assert calls == [(3, True)]
    b.release(3, 6)  # 7 > 5: still paused
    assert calls == [(3, True)]
    b.release(3, 3)  # 4 <= 5: resumed
    assert calls == [(3, True), (3, False)] and b.held == {3: 4, 4: 2}


async def test_a_peers_notice_that_lands_with_the_deadline_is_the_error_raised():
    """The notice of a peer's timeout and this rank's own deadline can fire in one loop turn: the
    receives the notice failed no longer say whom this rank waited for, so the notice is raised."""
    from aioccl.engine.op import Progress

    loop = asyncio.get_running_loop()
    progress = Progress()
    waiting, failed = loop.create_future(), loop.create_future()
    progress.recvs += [(1, waiting), (2, failed)]
    assert progress.told() is None and progress.waiting_for() == [1, 2]
    told = aioccl.CollectiveTimeout("all_reduce", 0, [2], 0.5, "reported by rank 0")
    failed.set_exception(told)
    assert progress.told() is told and progress.waiting_for() == [1]


def test_a_timeouts_chain_is_followed_to_the_silent_ranks():
    from aioccl.engine.blame import Reports, follow
    from aioccl.transport.frames import TIMEOUT

    # a chain 0 -> 1 -> 2 -> 3 -> 4 (4 and 5 cut off): each waits for its left neighbour; 4 and 5 said nothing
    reports = {1: [0], 2: [1], 3: [2], 0: [5]}
    assert follow([2], reports, me=3) == ([5], [0, 1, 2])
    assert follow([0], {**reports, 1: [0]}, me=1) == ([5], [0])
    # the chain comes back to this rank: it goes on through this rank's own wait, which names nobody new
    assert follow([1], {2: [1], 1: [2]}, me=2) == ([], [1])
    assert follow([1], {1: [0], 0: [1]}, me=0) == ([], [1])
    assert follow([3], {}, me=0) == ([3], [])  # nobody reported: the rank named stays named
    # a late rank told of a timeout: the chain ends at itself, which waits for nobody (issue 45)
    assert follow([1], {0: [1], 1: [2], 2: []}, me=2) == ([2], [1])
    r = Reports()
    r.record((1, 7), 4, TIMEOUT, [2])
    r.record((1, 7), 4, TIMEOUT, [9])  # a notice passed on by rank 4 carries another's culprits: the first word stays
    assert r.of((1, 7)) == {4: [2]} and r.of((1, 6)) == {}


def test_a_rank_stuck_one_collective_behind_is_followed_there():
    """Cut off mid-op, some ranks finish op 25 and wait in op 26 for rank 0, which still waits in op 25 for
    rank 5: the chain for op 26 goes through rank 0's report for op 25 (never through a later op's)."""
    from aioccl.engine.blame import Reports, follow
    from aioccl.transport.frames import TIMEOUT

    r = Reports()
    r.record((1, 25), 0, TIMEOUT, [5])
    r.record((1, 27), 0, TIMEOUT, [3])  # later than the op asked about: ignored
    r.record((2, 26), 0, TIMEOUT, [4])  # another communicator: ignored
    r.record((1, 26), 3, TIMEOUT, [2])
    assert r.of((1, 26)) == {0: [5], 3: [2]}
    assert follow([0], r.of((1, 26)), me=2) == ([5], [0])


def test_a_reduction_runs_early_only_when_later_receives_cannot_touch_it():
    """The executor reduces a message as soon as it lands unless a later receive of the same step lands
    in what that reduction reads or writes (then the step's reductions wait for all, in order)."""
    from aioccl.algorithms.schedule import IN, OUT, SCRATCH, Recv, RecvReduce, Region, Step, early_reductions
    from aioccl.algorithms.schedule import reduces_early as _safe_early

    t = RecvReduce(1, Region(OUT, 0, 10), Region(IN, 0, 10), Region(SCRATCH, 0, 10))
    assert _safe_early(t, ())
    assert _safe_early(t, (RecvReduce(2, Region(OUT, 10, 20), Region(IN, 10, 20), Region(SCRATCH, 10, 20)),))
    assert not _safe_early(t, (RecvReduce(2, Region(OUT, 0, 10), Region(IN, 0, 10), Region(SCRATCH, 5, 15)),))
    # a later reduction into the same destination: still applied after this one, in order
    assert _safe_early(t, (RecvReduce(2, Region(OUT, 0, 10), Region(OUT, 0, 10), Region(SCRATCH, 10, 20)),))
    assert not _safe_early(t, (Recv(2, Region(OUT, 5, 6)),))  # lands in its destination
    assert not _safe_early(t, (Recv(2, Region(IN, 9, 12)),))  # lands in its source
    assert _safe_early(t, (Recv(2, Region(IN, 10, 12)),))
    # per step, computed once with the schedule: the leading receives that qualify
    later = RecvReduce(2, Region(OUT, 0, 10), Region(OUT, 0, 10), Region(SCRATCH, 10, 20))
    assert early_reductions(Step(recvs=(t, later))) == 2
    assert early_reductions(Step(recvs=(t, Recv(2, Region(OUT, 5, 6))))) == 0
    assert early_reductions(Step(recvs=(t,))) == 0  # one receive: nothing to overlap
    assert early_reductions(Step(recvs=(t, later), lockstep=True)) == 0


def test_a_rank_with_another_secret_is_told_so_and_the_root_names_where_it_came_from():
    """Two "nodes" given different secrets: the rank learns that the root refused its secret (not that the
    connection closed), and the root's final error names the address the wrong secret came from."""
    from aioccl import Communicator, UniqueId
    from aioccl.bootstrap.root import RootServer

    root = RootServer.bind("127.0.0.1", 0, b"r" * 16, timeout=2)
    root.start_thread()
    uid = UniqueId("127.0.0.1", root.port, b"r" * 16)
    errors: dict[int, BaseException] = {}

    def root_rank() -> None:
        try:
            Communicator.create_sync(uid, 0, 2, timeout=10)
        except BaseException as e:  # noqa: BLE001
            errors[0] = e

    t = threading.Thread(target=root_rank)
    t.start()
    wrong = UniqueId(uid.host, uid.port, bytes(16))
    with pytest.raises(BootstrapError, match="refused this rank's secret: every rank must be given the same"):
        Communicator.create_sync(wrong, 1, 2, timeout=3)
    t.join(30)
    assert isinstance(errors.get(0), BootstrapError), errors
    msg = str(errors[0])
    assert "ranks [1] of 2" in msg and "connections from 127.0.0.1 (1x) knew another secret" in msg, msg


def test_a_mismatch_describes_each_call_with_only_what_it_takes():
    """An all_reduce has no root and a broadcast no reduction op: neither appears in its description."""
    from aioccl.algorithms.table import BY_NAME
    from aioccl.dtypes import ReduceOp, dtype_code
    from aioccl.engine.executor import describe

    def desc(name: str, op: int) -> tuple[int, ...]:
        kind = BY_NAME[name].code | (1 << 8) | (dtype_code(np.dtype(np.int32)) << 16) | (op << 24)
        return (7, kind, 10, 0, 0, 0)

    ar, bc, red = describe(desc("all_reduce", ReduceOp.SUM.code)), describe(desc("broadcast", 0)), \
        describe(desc("reduce", ReduceOp.MAX.code))
    assert ar.startswith("all_reduce seq 7 of 10 x int32, op sum, algorithm") and "root" not in ar, ar
    assert bc.startswith("broadcast seq 7 of 10 x int32, root 0, algorithm") and " op " not in bc, bc
    assert ", op max, root 0, algorithm" in red, red


def test_a_host_whose_only_nic_is_a_veth_advertises_it_not_loopback(monkeypatch):
    """A container or network namespace: its one NIC is a veth, which other hosts reach; 127.0.0.1 they do not."""
    monkeypatch.setattr(netif, "ipv4_interfaces", lambda: [("lo", "127.0.0.1"), ("veth1", "10.77.0.2")])
    assert netif.default_advertised(None) == "10.77.0.2"
    monkeypatch.setattr(netif, "ipv4_interfaces",
                        lambda: [("lo", "127.0.0.1"), ("veth1", "10.77.0.2"), ("eth0", "192.168.1.5")])
    assert netif.default_advertised(None) == "192.168.1.5"  # a real NIC first, as NCCL orders them
    monkeypatch.setattr(netif, "ipv4_interfaces", lambda: [("lo", "127.0.0.1")])
    assert netif.default_advertised(None) == "127.0.0.1"
