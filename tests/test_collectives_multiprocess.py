"""The full collective matrix, in real processes through aioccl-run, for 1..5 ranks."""

from __future__ import annotations

import pytest

from conftest import launch


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("algo", ["latency", "bandwidth"])
def test_matrix(n, algo):
    env = {"AIOCCL_BUFFSIZE": "256"}  # 64 float32 per chunk: large sizes run many pipelined pieces
    if algo == "bandwidth":
        env["AIOCCL_ALGO"] = "ring,chain"
    else:
        env["AIOCCL_ALGO"] = "rd,tree"
    proc = launch(n, "collectives.py", env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if " checks, " in ln]
    assert len(lines) == n, proc.stdout[-2000:]
    assert all(ln.endswith(", 0 failures") for ln in lines), lines
