"""backend="aioccl" for torch.distributed, under torchrun with real processes: every c10d op against Gloo,
DDP and FSDP2 against one process, deadlines and a killed rank, and the registration itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import aioccl

from conftest import ROOT, TRANSPORT_ENV, WORKERS, own_tmpdir, reserved_port

torch = pytest.importorskip("torch", reason="torch is not installed (make test installs the CPU build)")
dist = pytest.importorskip("torch.distributed")


def torchrun(n: int, script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 240,
             monitor_s: float | None = None, extra: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """``torchrun --nproc-per-node n tests/workers/<script>``: torch's own launcher and store.
    ``monitor_s``: how often torchrun looks at its workers (once one has died, it kills the others)."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    monitor = ["--monitor-interval", str(monitor_s)] if monitor_s is not None else []
    with reserved_port(2) as ports, own_tmpdir() as tmp:  # torch's store, and aioccl's root on the next port
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n), *monitor, *(extra or []),
               "--master-port", str(ports.port), str(WORKERS / script), *args]
        return subprocess.run(cmd, env={**full_env, **tmp}, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("n, transport", [(2, "shm"), (3, "shm"), (2, "tcp")])
def test_every_c10d_op_equals_gloo_on_every_shared_dtype(n, transport):
    p = torchrun(n, "torch_c10d.py", "conformance", env=TRANSPORT_ENV[transport])
    for r in range(n):  # (torchrun interleaves the ranks' output: search, not split into lines)
        found = re.search(rf"\[rank {r}\] c10d n={n}: (\d+) checks, (\d+) failures", p.stdout)
        assert found is not None and found[2] == "0", p.stdout[-3000:] + p.stderr[-3000:]
        assert int(found[1]) > 200, found[0]  # every op ran, for every dtype
    assert p.returncode == 0, p.stderr[-3000:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device here (the CPU build, or no "
                    "GPU): CUDA tensors through backend='aioccl' run on a GPU machine (scripts/gpu-check.sh)")
def test_cuda_tensors_through_c10d_equal_gloo():
    p = torchrun(2, "torch_c10d.py", "cuda", timeout=600)
    for r in range(2):
        found = re.search(rf"\[rank {r}\] c10d n=2: (\d+) checks, (\d+) failures on cuda", p.stdout)
        assert found is not None and found[2] == "0", p.stdout[-3000:] + p.stderr[-3000:]
    assert p.returncode == 0, p.stderr[-3000:]


@pytest.mark.parametrize("mode, n", [("ddp", 2), ("fsdp2", 2), ("fsdp2", 4)])
def test_training_equals_one_process_on_the_whole_batch(mode, n):
    p = torchrun(n, "torch_ddp_check.py", mode, "5")
    for r in range(n):
        assert f"[rank {r}] {mode} n={n}: parameters equal to one process after 5 steps" in p.stdout, \
            p.stdout[-3000:] + p.stderr[-3000:]
    assert p.returncode == 0


def test_a_silent_rank_is_named_within_the_groups_timeout():
    p = torchrun(3, "torch_c10d.py", "timeout")  # new_group(timeout=2 s); rank 2 never joins its all_reduce
    for r in (0, 1):  # (the worker checks that each raised between 1.5 and 6 s after the call)
        assert f"[rank {r}] c10d n=3: 1 checks, 0 failures" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
        assert f"[rank {r}] raised after " in p.stdout
    assert "timed out after 2s waiting for ranks [2]" in p.stdout
    # as torch's own backends say it: what its suite's barrier-timeout tests (and users' code) match
    assert re.search(r"raised after [0-9.]+s: aioccl: Timed out waiting for ranks \[2\]: all_reduce \(seq \d+",
                     p.stdout), p.stdout[-2000:]
    assert re.search(" (Timed out|closed|timeout) ", p.stdout)


def test_a_killed_rank_is_named_by_the_survivors_at_once():
    # torchrun kills the survivors once it sees the dead rank: give them 3 s to raise and report (the
    # default 0.1 s lost one's report under load)
    p = torchrun(3, "torch_c10d.py", "killed", monitor_s=3)
    for r in (0, 1):
        assert f"[rank {r}] c10d n=3: 1 checks, 0 failures" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
    assert "lost connection to rank 2" in p.stdout


def test_the_backend_is_registered_by_torchs_entry_point_and_by_import():
    code = ("import torch.distributed as d; print('AIOCCL' in d.Backend._plugins); "
            "import aioccl.interop.c10d as c; print(c.register())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "1"})
    assert out.stdout.split() == ["True", "True"], out.stdout + out.stderr
    off = subprocess.run([sys.executable, "-c", "import torch.distributed as d; print('AIOCCL' in d.Backend._plugins)"
                          "; import aioccl; print('AIOCCL' in d.Backend._plugins)"], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert off.stdout.split() == ["False", "True"], off.stdout + off.stderr


def test_what_aioccl_cannot_do_is_refused_clearly():
    from aioccl.errors import InvalidArgument
    from aioccl.interop.c10d.process_group import AiocclProcessGroup

    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.BAND
    with pytest.raises(InvalidArgument, match="sum, product, min, max and avg"):
        AiocclProcessGroup._reduction(opts)
    with pytest.raises(InvalidArgument, match="one tensor per rank"):
        AiocclProcessGroup._single([torch.zeros(1), torch.zeros(1)], "allreduce")
    with pytest.raises(InvalidArgument, match="contiguous"):
        AiocclProcessGroup._flat(torch.zeros(4, 4)[:, 1], "all_gather_into_tensor")


@pytest.mark.parametrize("mode, fails, rdzv", [("raise", 1, "static"), ("raise", 2, "static"), ("init", 1, "static"),
                                               ("raise", 1, "c10d")])
def test_torchrun_restarts_an_aioccl_job_as_it_does_a_gloo_one(mode, fails, rdzv, loopback_port):
    """torch's store outlives an attempt: a restarted rank must find this attempt's unique id, never the dead
    root of the last one (it used to dial it, then wait out its deadline)."""
    extra = ["--max-restarts", "2"]
    if rdzv == "c10d":
        extra += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{loopback_port}", "--rdzv-id", "t"]
    proc = torchrun(2, "torch_restart.py", mode, str(fails), extra=extra, timeout=180, monitor_s=0.2)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    for r in (0, 1):
        assert f"RESTART_OK attempt={fails} rank={r}" in out, out[-4000:]


def test_a_stale_unique_id_fails_in_a_second_naming_why(loopback_port):
    """An id read from a store after its root exited (the root listened before it was published)."""
    from dataclasses import replace

    from aioccl import BootstrapError, Communicator
    from aioccl.bootstrap.unique_id import UniqueId

    stale = replace(UniqueId("127.0.0.1", loopback_port, bytes(16)), root_up=True)
    t0 = __import__("time").monotonic()
    with pytest.raises(BootstrapError, match="stale: it belongs to an earlier run or restart"):
        Communicator.create_sync(stale, 1, 2, timeout=60)
    assert __import__("time").monotonic() - t0 < 5


def test_with_aioccl_comm_secret_set_the_secret_stays_off_torchs_store(monkeypatch):
    """The secret policy of both launchers: AIOCCL_COMM_SECRET on every node keeps the secret off the network
    (the store gets the root's address only); a node without it is told what to set."""
    import threading

    from aioccl.interop.c10d import backend

    class Store:  # torch's Store interface as bootstrap uses it: set, and a get that waits
        def __init__(self) -> None:
            self.data: dict[str, bytes] = {}
            self.cond = threading.Condition()

        def set(self, key: str, value: str) -> None:
            with self.cond:
                self.data[key] = value.encode()
                self.cond.notify_all()

        def get(self, key: str) -> bytes:
            with self.cond:
                self.cond.wait_for(lambda: key in self.data, timeout=30)
                return self.data[key]

    secret = "ab" * 16
    monkeypatch.setenv("AIOCCL_COMM_SECRET", secret)
    store, comms = Store(), {}
    threads = [threading.Thread(target=lambda r=r: comms.__setitem__(r, backend.bootstrap(store, r, 2, 30)))
               for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(comms) == [0, 1]
    (published,) = store.data.values()
    assert published.endswith(backend.OWN_SECRET.encode()) and secret.encode() not in published, published
    for c in comms.values():
        c.close().wait()
    monkeypatch.delenv("AIOCCL_COMM_SECRET")
    with pytest.raises(aioccl.InvalidArgument, match="set the same AIOCCL_COMM_SECRET on this node too"):
        backend.bootstrap(store, 1, 2, 5)


def test_a_sparse_tensor_given_to_aioccls_own_api_is_refused_naming_its_layout():
    """(Through the c10d backend a sparse all_reduce is summed as Gloo sums it: torch_c10d.py checks it.)"""
    torch = pytest.importorskip("torch")
    from aioccl.tensors import view

    sparse = torch.sparse_coo_tensor(torch.tensor([[0, 2]]), torch.tensor([1.0, 2.0]), (4,), check_invariants=True)
    with pytest.raises(aioccl.InvalidArgument, match=r"x: torch tensor of layout torch.sparse_coo; aioccl takes "
                                                     r"dense \(torch.strided\) tensors: pass x.to_dense\(\)"):
        view(sparse, "x")
