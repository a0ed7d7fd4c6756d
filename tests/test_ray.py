"""aioccl on Ray (aioccl/ray/): the "AIOCCL" backend of ray.util.collective and aioccl's awaitable communicators in
actors, on one local Ray cluster for the module (Ray takes seconds to start: one cluster, not one per test).

What Ray's own tests check for its backends (python/ray/util/collective/tests/): group names, ranks and sizes,
destroy and init again, several groups at once, every op on every dtype with SUM/PRODUCT/MIN/MAX, numpy and
torch mixed; and what Ray users ask of a CPU backend: a killed actor named by PeerLost within
AIOCCL_PEER_TIMEOUT's 10 s, shrink() among the survivors, a new actor in a new group, awaitable ops that leave
the actor's loop free, blocking calls on an async actor's loop that never deadlock, and Ray Train's
TorchConfig(backend="aioccl"). The actors are tests/workers/ray_actors.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'aioccl[ray]'; make test installs it)")
WORKERS = Path(__file__).resolve().parent / "workers"
sys.path.insert(0, str(WORKERS))

import ray_actors  # noqa: E402
from ray.util import collective as col  # noqa: E402

import aioccl.ray  # noqa: E402

GET_S = 120  # a Ray call that takes longer is a hang


@pytest.fixture(scope="module")
def cluster():  # type: ignore[no-untyped-def]
    # a short folder: Ray's sockets live under it, and a Unix socket's path has at most 107 bytes
    folder = tempfile.mkdtemp(prefix="r")
    # Ray starts its workers niced (RAY_worker_niceness): beside the suite's other tests they would wait for
    # the CPU for minutes; at the priority of every other test's processes they share it evenly
    with mock.patch.dict(os.environ, {"RAY_worker_niceness": "0"}):  # noqa: SIM112 (Ray's name; read by the raylet)
        ray.init(num_cpus=8, include_dashboard=False, object_store_memory=80 << 20, _temp_dir=folder,
                 log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": str(WORKERS)},
                                                   "worker_process_setup_hook": "aioccl.ray.register"})
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(folder, ignore_errors=True)
        _reclaim()  # the GPU stand-in's device memory of actors Ray killed, as a driver frees it


def _reclaim() -> None:
    spec = importlib.util.spec_from_file_location("fakecupy_driver", WORKERS.parent / "fakecupy" / "fakecupy_driver.py")
    assert spec is not None and spec.loader is not None
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
    driver.reclaim()


def get(refs):  # type: ignore[no-untyped-def]
    return ray.get(refs, timeout=GET_S)


@pytest.fixture(scope="module")
def pool(cluster):  # type: ignore[no-untyped-def]
    """Four sync and four async actors, started once for the module (an actor takes a second or two to start);
    each test forms its own groups among them, under its own names."""
    members = [ray_actors.Member.remote() for _ in range(4)]
    asyncs = [ray_actors.AsyncMember.remote() for _ in range(4)]
    get([m.joined.remote("") for m in members] + [a.pid.remote() for a in asyncs])
    return members, asyncs


def test_importing_registers_the_backend_and_again_is_harmless() -> None:
    from ray.util.collective.backend_registry import _global_registry

    aioccl.ray.register()
    aioccl.ray.register()
    assert _global_registry.get("aioccl") is aioccl.ray.AiocclGroup
    assert col.is_backend_available("AIOCCL")


def test_every_op_every_dtype_and_reduction_exact_on_four_actors(pool) -> None:  # type: ignore[no-untyped-def]
    members = pool[0]
    joined = get([m.join.remote(4, r, "every") for r, m in enumerate(members)])
    assert [j[:2] for j in joined] == [(r, 4) for r in range(4)] and len({j[2] for j in joined}) == 4
    assert get([m.every_op.remote("every") for m in members]) == [[]] * 4
    assert get([m.leave.remote("every") for m in members]) == [False] * 4


def test_cupy_arrays_take_the_gpu_path(cluster) -> None:  # type: ignore[no-untyped-def]
    """cupy arrays through Ray's calls, on tests/fakecupy (a numpy stand-in with late streams and shared device
    memory) here; scripts/gpu-check.sh runs aioccl's GPU path on a real GPU."""
    fake = {"env_vars": {"PYTHONPATH": f"{WORKERS}:{WORKERS.parent / 'fakecupy'}"}}
    members = [ray_actors.Member.options(runtime_env=fake).remote() for _ in range(2)]
    get([m.join.remote(2, r, "gpu") for r, m in enumerate(members)])
    assert get([m.every_op_on_gpu.remote("gpu") for m in members]) == [[], []]
    assert get([m.leave.remote("gpu") for m in members]) == [False, False]


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_tensors_from_the_object_store_are_written_in_place_with_a_warning(pool, lib) -> None:  # type: ignore[no-untyped-def]
    """Ray hands an actor's numpy arguments out of its object store read-only (zero-copy); Ray's calls write
    into them as GLOO does, in place, with a ReadOnlyArrayWarning per call naming the actor's line (docs/ray.md).
    torch tensors from the store arrive writable and are written without one."""
    torch = pytest.importorskip("torch")
    a, b = pool[0][:2]
    name = f"store-{lib}"
    get([a.join.remote(2, 0, name), b.join.remote(2, 1, name)])
    count = 1 << 16  # large enough to live in the object store's shared memory, not inlined in the call
    make = (lambda v: torch.full((count,), float(v))) if lib == "torch" else \
        (lambda v: np.full(count, v, np.float32))
    kept = [ray.put([make(1), make(1)] + [make(-1) for _ in range(4)]) for _ in range(2)]
    res = get([a.from_the_store.remote(name, kept[0], lib), b.from_the_store.remote(name, kept[1], lib)])
    for r, got in enumerate(res):
        assert got["bad"] == [], (r, got["bad"])
        if lib == "numpy":
            assert got["read_only"] == [True] * 6, got["read_only"]
            # the broadcast from rank 1 and the reduce to rank 0 write only into rank 0's tensors: no warning on 1
            written = ["allreduce", "allgather", "allgather", "reducescatter"] + \
                (["broadcast", "reduce"] if r == 0 else ["recv"])
            assert sorted(w for w, _ in got["warned"]) == sorted(f"ray.util.collective.{w}" for w in written)
            assert {f for _, f in got["warned"]} == {"ray_actors.py"}, got["warned"]
        else:
            assert got["read_only"] == [False] * 6 and got["warned"] == [], got
    get([a.leave.remote(name), b.leave.remote(name)])


def test_refused_calls_raise_what_rays_callers_catch(pool) -> None:  # type: ignore[no-untyped-def]
    """A shape or dtype that does not match: refused before anything is sent, as an aioccl InvalidArgument that
    is also a RuntimeError (Ray's GLOO backend raises torch's RuntimeErrors; its reducescatter a ValueError,
    which InvalidArgument is too), in the actor and at the driver. A list of the wrong length (and a rank out
    of range) ray.util.collective refuses itself, for every backend."""
    a, b = pool[0][2:4]
    get([a.join.remote(2, 0, "refused"), b.join.remote(2, 1, "refused")])
    for got in get([a.mismatches.remote("refused"), b.mismatches.remote("refused")]):
        assert got[:2] == [("allgather: a list of the wrong length", "RuntimeError", True, False),
                           ("reducescatter: a list of the wrong length", "RuntimeError", True, False)], got  # Ray's
        assert all(kind == "InvalidArgument" and runtime and ours for _, kind, runtime, ours in got[2:-1]), got
        assert got[-1] == ("then an allreduce", "exact", True, True)
    refs = [a.mismatched_allgather.remote("refused"), b.mismatched_allgather.remote("refused")]
    for ref in refs:
        with pytest.raises(RuntimeError, match="allgather: tensor_list\\[0\\] is 5 x float32") as e:
            get(ref)
        assert isinstance(e.value, aioccl.InvalidArgument) and isinstance(e.value, ValueError)
    get([a.leave.remote("refused"), b.leave.remote("refused")])


def test_ray_kinds_pickle_as_themselves_with_their_data() -> None:
    import pickle

    from aioccl.errors import CollectiveTimeout, PeerLost
    from aioccl.ray.errors import as_ray_error

    t = as_ray_error(CollectiveTimeout("all_reduce", 7, [2], 3.0, comm="c"))
    p = as_ray_error(PeerLost(3, "gone"))
    for e in (t, p, pickle.loads(pickle.dumps(t)), pickle.loads(pickle.dumps(p))):
        assert isinstance(e, RuntimeError) and isinstance(e, aioccl.AiocclError)
    back = pickle.loads(pickle.dumps(t))
    assert isinstance(back, CollectiveTimeout) and isinstance(back, TimeoutError)
    assert (type(back).__name__, back.seq, back.waiting_for, str(back)) == ("CollectiveTimeout", 7, [2], str(t))
    assert pickle.loads(pickle.dumps(p)).rank == 3
    assert type(as_ray_error(t)) is type(t)  # a Ray kind stays itself


def test_a_collective_nobody_joins_names_the_silent_ranks_at_the_deadline(pool) -> None:  # type: ignore[no-untyped-def]
    """AIOCCL_TIMEOUT in the actors' environment is the group's deadline (Ray's calls take none of their own)."""
    members = pool[0][:3]
    get([m.join.remote(3, r, "silent", aioccl_timeout="3") for r, m in enumerate(members)])
    err, waiting, took = get(members[0].alone.remote("silent"))
    assert (err, sorted(waiting)) == ("CollectiveTimeout/RuntimeError", [1, 2])  # also what Ray's callers catch
    assert 3.0 <= took < 11.0


def test_names_ranks_destroy_init_again_and_groups_side_by_side(pool) -> None:  # type: ignore[no-untyped-def]
    a, b = pool[0][:2]
    for name in ("default", "123?34!"):
        assert [r[:2] for r in get([a.join.remote(2, 0, name), b.join.remote(2, 1, name)])] == [(0, 2), (1, 2)]
    # ranks in the other order, in a third group live beside the others
    assert [r[:2] for r in get([a.join.remote(2, 1, "flipped"), b.join.remote(2, 0, "flipped")])] == [(1, 2), (0, 2)]
    for name in ("flipped", "default", "123?34!"):
        assert get([a.ones.remote(name), b.ones.remote(name)]) == [2.0, 2.0]
    # destroyed on one side, then the other, then made again under the same name
    assert get(a.leave.remote("default")) is False
    assert get([a.joined.remote("default"), b.joined.remote("default")]) == [False, True]
    assert get(b.leave.remote("default")) is False
    assert [r[:2] for r in get([a.join.remote(2, 0, "default"), b.join.remote(2, 1, "default")])] == [(0, 2), (1, 2)]
    assert get([a.ones.remote("default"), b.ones.remote("default")]) == [2.0, 2.0]


def test_a_group_declared_from_the_driver(pool) -> None:  # type: ignore[no-untyped-def]
    actors = pool[1][:3]
    aioccl.ray.create_group(actors, "declared", ranks=[2, 0, 1])
    assert get([a.join.remote(None, None, "declared") for a in actors]) == [(2, 3), (0, 3), (1, 3)]
    assert get([a.all_reduce.remote("declared", 1000) for a in actors]) == [[]] * 3
    get([a.close.remote("declared") for a in actors])
    with pytest.raises(ray.exceptions.RayTaskError, match="declare the group from the driver"):
        get(actors[0].join.remote(None, None, "never-declared"))


def test_a_stale_id_in_rays_store_is_waited_past(pool) -> None:  # type: ignore[no-untyped-def]
    """A rank 0 that died before its group formed leaves its id under the group's key: the next rank 1 tries it
    (refused: its root is gone), waits, and meets the new rank 0, which overwrote it and takes it away once the
    group has formed."""
    import socket

    from ray.experimental import internal_kv

    from aioccl.ray import rendezvous

    with socket.socket() as s:  # a port nobody listens on any more
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    stale = str(aioccl.UniqueId("127.0.0.1", port, bytes(16)))
    internal_kv._internal_kv_put(rendezvous.key("comm", "stale"), stale, True, namespace=rendezvous.NAMESPACE)
    a, b = pool[1][:2]
    second = b.join.remote(2, 1, "stale")
    time.sleep(1.0)  # rank 1 has met the stale id by now
    assert get([a.join.remote(2, 0, "stale"), second]) == [(0, 2), (1, 2)]
    assert get([a.all_reduce.remote("stale"), b.all_reduce.remote("stale")]) == [[], []]
    # rank 0 takes its id off the store once the group formed, on a thread of its own (off the first op's way)
    deadline = time.monotonic() + 10.0
    while internal_kv._internal_kv_get(rendezvous.key("comm", "stale"), namespace=rendezvous.NAMESPACE) is not None:
        assert time.monotonic() < deadline, "rank 0 left its id in Ray's store"
        time.sleep(0.01)
    get([a.close.remote("stale"), b.close.remote("stale")])


def test_awaitable_ops_leave_the_actors_loop_free(pool) -> None:  # type: ignore[no-untyped-def]
    actors = pool[1]
    assert get([a.join.remote(4, r, "loop") for r, a in enumerate(actors)]) == [(r, 4) for r in range(4)]
    assert get([a.all_reduce.remote("loop", 4096) for a in actors]) == [[]] * 4
    late = get([a.late_ticks.remote("loop", 0.3) for a in actors])
    # the last rank joins 0.3 s late: a loop blocked by the wait would fire the timer 0.3 s late
    assert max(late) < 0.05, late
    get([a.close.remote("loop") for a in actors])


def test_blocking_calls_on_an_async_actors_loop_never_deadlock(pool) -> None:  # type: ignore[no-untyped-def]
    actors = pool[1][:2]
    assert get([a.blocking_in_loop.remote(2, r, "blocking") for r, a in enumerate(actors)]) == [[], []]


def test_a_killed_actor_is_peer_lost_then_shrink_then_it_restarts_and_joins(cluster) -> None:  # type: ignore[no-untyped-def]
    actors = [ray_actors.AsyncMember.options(max_restarts=1).remote() for _ in range(3)]
    get([a.join.remote(3, r, "kill") for r, a in enumerate(actors)])
    before = get(actors[2].pid.remote())
    waiting = [a.across_a_kill.remote("kill") for a in actors[:2]]  # an all_reduce that rank 2 never joins
    killed_at = _kill_while_they_wait(actors[2], no_restart=False)  # Ray starts it again, a fresh process
    for err, who, raised_at, bad in get(waiting):
        assert (err, who, bad) == ("PeerLost", 2, [])
        assert raised_at - killed_at < 10.0  # AIOCCL_PEER_TIMEOUT; a crashed process is seen at once
    assert _restarted(actors[2]) != before
    assert get([a.join.remote(3, r, "after-kill") for r, a in enumerate(actors)]) == [(0, 3), (1, 3), (2, 3)]
    assert get([a.all_reduce.remote("after-kill") for a in actors]) == [[]] * 3


def _restarted(actor):  # type: ignore[no-untyped-def]
    """The restarted actor's pid, once Ray has started it again (calls fail meanwhile: it is restarting)."""
    deadline = time.monotonic() + GET_S
    while True:
        try:
            return get(actor.pid.remote())
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_a_killed_member_is_peer_lost_through_ray_util_collective(cluster) -> None:  # type: ignore[no-untyped-def]
    members = [ray_actors.Member.remote() for _ in range(3)]
    get([m.join.remote(3, r, "kill-sync") for r, m in enumerate(members)])
    waiting = [m.across_a_kill.remote("kill-sync") for m in (members[0], members[2])]
    killed_at = _kill_while_they_wait(members[1])
    for err, who, raised_at in get(waiting):
        assert (err, who) == ("PeerLost/RuntimeError", 1) and raised_at - killed_at < 10.0


def _kill_while_they_wait(actor, no_restart: bool = True) -> float:  # type: ignore[no-untyped-def]
    """Kill ``actor`` once the others have had time to start waiting for it; when (``time.time()``)."""
    time.sleep(0.5)
    at = time.time()
    ray.kill(actor, no_restart=no_restart)
    return at


def test_ray_train_torch_config_aioccl(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """DDP over aioccl in Ray Train: one SGD step on 2 workers gives the single-process step's parameters,
    exactly (integer weights and data, lr a power of two)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("ray.train", reason="Ray Train's extras are not installed (pip install 'ray[train]')")
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    trainer = TorchTrainer(ray_actors.train_step, train_loop_config={"out": str(tmp_path)},
                           scaling_config=ScalingConfig(num_workers=2), torch_config=TorchConfig(backend="aioccl"),
                           run_config=RunConfig(storage_path=str(tmp_path / "store"), name="ddp"))
    trainer.fit()
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    model = ray_actors.model(torch)
    loss = sum(model(ray_actors.batch(torch, r)).sum() for r in range(2)) / 2  # DDP averages the two ranks' gradients
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.5 * p.grad
    want = [p.tolist() for p in model.parameters()]
    assert [g["backend"] for g in got] == ["aioccl", "aioccl"]
    assert got[0]["params"] == got[1]["params"] == want


def test_op_arguments_are_checked_before_anything_is_sent() -> None:
    from aioccl.errors import InvalidArgument
    from aioccl.ray import backend

    with pytest.raises(InvalidArgument, match="one tensor per process"):
        backend._one([np.zeros(1), np.zeros(1)])
    with pytest.raises(InvalidArgument, match="must match"):
        backend._alike([np.zeros(2, np.float32)], np.zeros(2, np.float64), "allgather")
    with pytest.raises(InvalidArgument, match="n_elements"):
        backend._part(np.zeros(4), 5)
    assert backend._timeout(col.types.AllReduceOptions) is None  # Ray passes the class, its timeout unset
    opts = col.types.BarrierOptions()
    opts.timeout_ms = 1500
    assert backend._timeout(opts) == 1.5
