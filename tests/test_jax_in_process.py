"""Mesh-level jax_ext ops among devices of one process are XLA's collectives; across processes, aioccl carries
only what crosses (jax_ext/in_process.py). Exact against jax.lax in both placements; the lowered programs
hold the calls each placement says (tests/workers/jax_in_process.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from test_jax_ext import _run_procs

from conftest import ROOT, WORKERS


@pytest.mark.parametrize("mode", ["auto", "xla", "aioccl"])
def test_one_process_mesh_ops_run_where_the_mode_says(mode: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AIOCCL_JAX_MESH": mode}
    r = subprocess.run([sys.executable, str(WORKERS / "jax_in_process.py")], env=env, capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0 and "PLACED OK 176" in r.stdout, r.stdout[-4000:] + r.stderr[-4000:]


def test_two_processes_reduce_inside_with_xla_and_across_with_aioccl() -> None:
    """2 processes x 2 devices, ops past auto's size: over the in-process axis lax's alone, over the
    cross-process one aioccl's alone, over both lax's then aioccl's; smaller ones aioccl's; every result equal
    to lax's (JAX's Gloo collectives)."""
    outs = _run_procs("jax_in_process.py", 2, {})
    assert all("PLACED OK 88" in o for o in outs), outs


def _mesh(procs: list[list[int]], names: tuple[str, ...] = ("x", "y")) -> SimpleNamespace:
    devices = np.array([[SimpleNamespace(process_index=p) for p in row] for row in procs], dtype=object)
    return SimpleNamespace(devices=devices, axis_names=names)


def test_split_keeps_the_axes_whose_every_step_stays_in_a_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from jax_ext.in_process import split

    monkeypatch.delenv("AIOCCL_JAX_MESH", raising=False)
    rows = _mesh([[0, 0], [1, 1]])  # x across the processes, y inside
    assert split(rows, ("x", "y")) == (("y",), ("x",))
    assert split(rows, ("y", "x")) == (("y",), ("x",))
    assert split(_mesh([[0, 1], [0, 1]]), ("x", "y")) == (("x",), ("y",))
    assert split(_mesh([[0, 0], [0, 1]]), ("x", "y")) == ((), ("x", "y"))  # neither stays everywhere
    assert split(_mesh([[3, 3], [3, 3]]), ("y", "x")) == (("y", "x"), ())


def test_an_unknown_mesh_mode_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from jax_ext import in_process

    monkeypatch.setenv("AIOCCL_JAX_MESH", "nccl")
    with pytest.raises(ValueError, match="AIOCCL_JAX_MESH='nccl'"):
        in_process.mode()
    monkeypatch.setenv("AIOCCL_JAX_MESH", " XLA ")
    assert in_process.mode() == "xla"
    for bad in ("lots", "-1"):
        monkeypatch.setenv("AIOCCL_JAX_MESH_BYTES", bad)
        with pytest.raises(ValueError, match="AIOCCL_JAX_MESH_BYTES"):
            in_process.xla_from()
    monkeypatch.setenv("AIOCCL_JAX_MESH_BYTES", "0")
    assert in_process.xla_from() == 0 and in_process.xla_takes(8)  # (mode xla, from above)
    monkeypatch.setenv("AIOCCL_JAX_MESH", "auto")
    assert in_process.xla_takes(0)  # from 0 bytes: every size
