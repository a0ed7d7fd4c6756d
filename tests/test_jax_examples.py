"""The JAX examples run as documented: in make test's main venv (jax 0.10) and in .venv-jax (the newest jax)."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT


def run_example(n: int, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aioccl.run", "--nproc-per-node", str(n),
                           str(ROOT / "examples" / name), *args],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=180)


def test_jax_data_parallel_matches_single_process_training():
    p = run_example(2, "jax_data_parallel.py", "--steps", "20")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "2 processes, 20 steps" in p.stdout and "largest relative difference" in p.stdout


def test_jax_shard_map_example_one_process_and_two():
    one = subprocess.run([sys.executable, str(ROOT / "examples" / "jax_shard_map.py")], capture_output=True,
                         text=True, timeout=180, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert one.returncode == 0 and "gradients equal" in one.stdout, one.stdout + one.stderr[-3000:]
    two = run_example(2, "jax_shard_map.py", "--devices", "2")
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-3000:]
    assert two.stdout.count("on 2 process(es)") == 2 and "DIFFERENT" not in two.stdout
