"""The examples run as documented; AIOCCL_DEBUG / AIOCCL_DEBUG_SUBSYS shape the log like NCCL_DEBUG."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, own_tmpdir


def run_example(n: int, name: str, *args: str, env: dict[str, str] | None = None):
    return subprocess.run([sys.executable, "-m", "aioccl.run", "--nproc-per-node", str(n),
                           str(ROOT / "examples" / name), *args],
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                          capture_output=True, text=True, timeout=180)


def test_hello_allreduce_and_debug_subsystems():
    p = run_example(3, "hello_allreduce.py", env={"AIOCCL_DEBUG": "INFO", "AIOCCL_DEBUG_SUBSYS": "INIT,COLL"})
    assert p.returncode == 0, p.stderr
    for r in range(3):
        assert f"[rank {r}] rank {r}/3: [6. 6. 6. 6.]" in p.stdout
    assert "AIOCCL INFO INIT" in p.stderr and "AIOCCL INFO COLL" in p.stderr
    assert "BOOTSTRAP" not in p.stderr  # filtered out
    quiet = run_example(2, "hello_allreduce.py")
    assert "AIOCCL" not in quiet.stderr


def test_ray_data_parallel_on_async_actors():
    """Actors declared a group by the driver average their gradients with awaited all_reduces, exactly."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'aioccl[ray]'; make test installs it)")
    p = subprocess.run([sys.executable, str(ROOT / "examples" / "ray_data_parallel.py"), "--actors", "3", "--steps",
                        "4"], env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    assert "3 actors, 4 steps: every actor's weights" in p.stdout


@pytest.mark.parametrize("arrays", ["numpy", "torch"])
def test_p2p_pipeline_trains_forward_and_backward_exactly(arrays):
    """Each stage checks its layer's gradient against the whole network run in one process."""
    if arrays == "torch":
        pytest.importorskip("torch")
    p = run_example(4, "p2p_pipeline.py", "--micro-batches", "7", "--rows", "3", "--width", "16", "--steps", "2",
                    "--depth", "3", *(["--torch"] if arrays == "torch" else []))
    assert p.returncode == 0, p.stderr
    assert "2 steps of 7 micro-batches through 4 stages" in p.stdout and "gradient checked" in p.stdout


def test_demo_small_sweep():
    p = run_example(2, "demo.py", "--max-bytes", "64K")
    assert p.returncode == 0, p.stderr
    assert "wrong elements: 0; all operations correct" in p.stdout
    assert p.stdout.count(" ok") == 10


def test_elastic_training_continues_on_the_survivors():
    """A rank is SIGKILLed mid-training under ``aioccl-run --keep-going``; the others see PeerLost at once,
    shrink, and match 1-process training; the launcher names the killed rank and exits with its code."""
    p = subprocess.run([sys.executable, "-m", "aioccl.run", "--keep-going", "--nproc-per-node", "4",
                        str(ROOT / "examples" / "elastic_training.py"), "--kill-rank", "1", "--kill-step", "6",
                        "--steps", "20"],
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=180)
    assert p.returncode == 128 + 9, p.stdout + p.stderr
    assert "first failure: rank 1 was killed by SIGKILL" in p.stderr, p.stderr
    lost = re.findall(r"\[rank \d\] step 6: PeerLost\(rank 1\) after ([0-9.]+)s;", p.stdout)
    assert len(lost) == 3 and all(float(t) < 2.0 for t in lost), p.stdout
    for rank in (0, 2, 3):
        assert re.search(rf"\[rank {rank}\] finished 20 steps on 3 ranks: .* = \d", p.stdout), p.stdout
    errs = [float(e) for e in re.findall(r"max \|w - single-process w\| = ([0-9.e+-]+)", p.stdout)]
    assert len(errs) == 3 and max(errs) <= 1e-9, p.stdout


def test_elastic_training_run_directly_starts_itself_under_the_launcher():
    p = subprocess.run([sys.executable, str(ROOT / "examples" / "elastic_training.py"), "--ranks", "3",
                        "--kill-rank", "2", "--kill-step", "3", "--steps", "8"],
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=180)
    assert p.returncode == 128 + 9 and p.stdout.count("finished 8 steps on 2 ranks") == 2, p.stdout + p.stderr


def test_torch_data_parallel_matches_single_process_training():
    pytest.importorskip("torch", reason="torch is not installed (make test installs the CPU build)")
    p = run_example(2, "torch_data_parallel.py", "--steps", "20")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "2 processes, 20 steps: replicas identical" in p.stdout
    assert "Warning" not in p.stderr, p.stderr[-2000:]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_anyio_pipeline_on_both_backends(backend):
    p = run_example(3, "anyio_pipeline.py", "--backend", backend, "--rounds", "10")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    engine = "inline" if backend == "asyncio" else "thread"
    assert f"3 ranks, 10 rounds under {engine} engine: all results checked" in p.stdout
    assert "INFO" not in p.stdout + p.stderr  # nothing (pyverbs' import included) turned on INFO logging


def test_torch_ddp_tutorial_runs_under_torchrun_with_backend_aioccl(loopback_port):
    pytest.importorskip("torch", reason="torch is not installed (make test installs the CPU build)")
    with own_tmpdir() as tmp:
        p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                            str(loopback_port), str(ROOT / "examples" / "torch_ddp.py")],
                           env={**os.environ, "OMP_NUM_THREADS": "1", **tmp}, capture_output=True, text=True,
                           timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for r in range(2):
        assert f"basic DDP example on rank {r} (backend aioccl)" in p.stdout and f"rank {r}: loss" in p.stdout


def test_every_example_is_run_by_this_file_and_listed_in_the_docs():
    # the JAX examples run from test_jax_examples.py, which make test also runs on the newest jax
    mine = Path(__file__).read_text() + (Path(__file__).parent / "test_jax_examples.py").read_text()
    gallery = (ROOT / "docs" / "examples.md").read_text()
    for path in sorted((ROOT / "examples").glob("*.py")):
        assert f'"{path.name}"' in mine, f"examples/{path.name} is not run by the tests"
        assert f"examples/{path.name}" in gallery, f"examples/{path.name} is not in docs/examples.md"


def test_pipeline_1f1b_is_exact_and_stops_every_stage_when_one_fails():
    """examples/pipeline_1f1b.py: 4 stages, gradients equal to one process's; with stage 2 failing on purpose,
    every stage stops (exit 1) naming it, none waits for a deadline, and nothing is reported at exit."""
    ok = run_example(4, "pipeline_1f1b.py", "--steps", "2", "--micro-batches", "6")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert sorted(ln for ln in ok.stdout.splitlines() if "gradients equal" in ln) == [
        f"[rank {r}] stage {r}/4: 2 steps of 6 microbatches, gradients equal to one process's" for r in range(4)]
    broken = subprocess.run([sys.executable, "-m", "aioccl.run", "--keep-going", "--nproc-per-node", "4",
                             str(ROOT / "examples" / "pipeline_1f1b.py"), "--fail-rank", "2"],
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
    err = broken.stderr
    assert broken.returncode == 1, broken.stdout + err
    assert "[rank 2] stage 2: stopping: RuntimeError: stage 2 failed" in err, err
    for r in (0, 1, 3):  # each names rank 2: directly, or through the neighbour that aborted because of it
        line = next((ln for ln in err.splitlines() if ln.startswith(f"[rank {r}] stage {r}: stopping:")), "")
        assert "PeerLost" in line and "rank 2" in line, err
    assert "nobody awaited" not in err and "never finished" not in err, err
