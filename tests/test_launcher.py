"""aioccl-run: environment, prefixed output, fail-fast naming the rank, signal forwarding."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from conftest import ROOT, WORKERS, launch


def test_prefixes_and_environment():
    proc = launch(3, "echo_env.py")
    assert proc.returncode == 0, proc.stderr
    lines = sorted(ln for ln in proc.stdout.splitlines() if "world=" in ln)
    assert lines == [f"[rank {r}] rank={r} world=3 local={r}" for r in range(3)]


def test_failing_rank_stops_the_rest_and_is_named():
    t0 = time.monotonic()
    proc = launch(3, "fail_one.py")
    assert proc.returncode == 3
    assert "rank 1 exited with code 3" in proc.stderr
    assert time.monotonic() - t0 < 60  # the others were stopped, not waited for


def test_sigterm_is_forwarded():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "aioccl.run", "--nproc-per-node", "2", str(WORKERS / "sleeper.py")],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    out = ""
    while "ready" not in out and time.monotonic() < deadline:
        out += p.stdout.readline()
    p.send_signal(signal.SIGTERM)
    rest, _ = p.communicate(timeout=60)
    assert "got SIGTERM" in out + rest
    assert p.returncode != 0


def test_module_target_and_arguments():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "aioccl.run", "--nproc-per-node", "2", "-m", "json.tool", "--help"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("usage:") == 2 and "[rank 1] usage:" in p.stdout
