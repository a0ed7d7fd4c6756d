"""torch's own distributed suite (``distributed_test._DistTestBase``): every test that passes on Gloo passes on
aioccl, but the Gloo-only ones (``scripts/torch_suite.py``'s ``GLOO_ONLY``, listed in docs/torch.md).

The suite's gates treat aioccl as Gloo (``--gates gloo``), and a Gloo group made any other way raises, so a
test that passes ran on aioccl. Which tests pass on Gloo comes from tests/data/torch_suite_gloo.json for the
torch version it records (made by the same driver with ``--backend gloo``), else from a Gloo run here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import ROOT

DRIVER = ROOT / "scripts" / "torch_suite.py"
sys.path.insert(0, str(DRIVER.parent))
import torch_suite  # noqa: E402

pytest.importorskip("expecttest", reason="torch's test utilities need expecttest (make test installs it)")


def _run(out: Path, *args: str) -> dict:
    p = subprocess.run([sys.executable, str(DRIVER), *args, "--out", str(out)], capture_output=True,
                       text=True, timeout=900, cwd=out.parent)
    assert p.returncode == 0 and out.exists(), p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(out.read_text())


def _gloo_passes(tmp: Path, n: int) -> Path:
    recorded = json.loads((ROOT / "tests" / "data" / "torch_suite_gloo.json").read_text())["passed_on_gloo"]
    names = recorded.get(f"{torch.__version__} world {n}")
    path = tmp / f"gloo-{n}.json"
    if names is None:  # another torch: ask Gloo here
        _run(path, "--backend", "gloo", "--world-size", str(n))
    else:
        path.write_text(json.dumps({"tests": {k: {"outcome": "passed"} for k in names}}))
    return path


@pytest.mark.timeout(900)
@pytest.mark.parametrize("n", [2, 3])
def test_every_test_that_passes_on_gloo_passes_on_aioccl(n: int, tmp_path: Path) -> None:
    gloo = _gloo_passes(tmp_path, n)
    mine = _run(tmp_path / f"aioccl-{n}.json", "--backend", "aioccl", "--world-size", str(n), "--gates", "gloo",
                "--passed-in", str(gloo))
    base = json.loads(gloo.read_text())["tests"]
    assert len(mine["tests"]) == len(base) > 60, (len(mine["tests"]), len(base))
    lost = {name: f"{o['outcome']}: {o['why'][-400:]}" for name, o in mine["tests"].items()
            if o["outcome"] != "passed"}
    unexplained = {k: v for k, v in lost.items() if k not in torch_suite.GLOO_ONLY}
    assert not unexplained, json.dumps(unexplained, indent=1)
    stale = set(torch_suite.GLOO_ONLY) & set(base) - set(lost)
    assert not stale, f"these pass on aioccl now: take them off GLOO_ONLY and docs/torch.md: {sorted(stale)}"


def test_the_gloo_only_tests_are_listed_in_the_docs() -> None:
    doc = (ROOT / "docs" / "torch.md").read_text()
    assert all(f"`{name}`" in doc for name in torch_suite.GLOO_ONLY), sorted(torch_suite.GLOO_ONLY)
