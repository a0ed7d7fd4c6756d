"""``aioccl-info``: every knob listed with its value in effect, typos and bad values flagged, secrets hidden."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from aioccl import knobs

from conftest import ROOT


def info(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AIOCCL_")}
    return subprocess.run([sys.executable, "-m", "aioccl.tools.info", *args], capture_output=True, text=True,
                          timeout=120, env={**clean, "PYTHONPATH": str(ROOT), **env})


def test_every_knob_the_code_reads_is_in_the_table_and_in_the_docs():
    used = set()
    for folder in ("aioccl", "jax_ext"):
        for path in (ROOT / folder).rglob("*.py"):
            used |= set(re.findall(r"AIOCCL_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    table = {k.name for k in knobs.KNOBS}
    assert used - table == set(), "knobs read by the code but missing from aioccl/knobs.py"
    assert table - used == set(), "knobs in the table that no code reads"
    rows = {m[0]: m[1] for m in re.findall(r"^\| `(AIOCCL_[A-Z0-9_]+)` \| `?([^`|]+?)`? \|", (ROOT / "docs" / "env.md")
                                            .read_text(), re.M)}
    assert set(rows) == table, "docs/env.md's table and aioccl/knobs.py list different knobs"
    for k in knobs.KNOBS:
        assert rows[k.name] == k.default, f"{k.name}: docs/env.md says {rows[k.name]!r}, knobs.py {k.default!r}"


def test_json_report():
    p = info("--json", AIOCCL_TIMEOUT="abc", AIOCCL_TIMOUT="3", AIOCCL_SOCKET_IFNAME="=lo",
             AIOCCL_COMM_SECRET="0123456789abcdef0123456789abcdef", AIOCCL_IB_SLOTS="1",
             AIOCCL_FLIGHT_RECORDER="many", AIOCCL_GPU_SCRATCH="1")
    assert p.returncode == 0, p.stderr
    assert "0123456789abcdef" not in p.stdout
    r = json.loads(p.stdout)
    assert r["env"]["AIOCCL_TIMEOUT"] == {"value": "abc", "set": True, "default": "300",
                                          "meaning": knobs.KNOBS[6].meaning}
    assert r["env"]["AIOCCL_COMM_SECRET"]["value"] == "(set, hidden)"
    assert r["env"]["AIOCCL_BUFFSIZE"] == {"value": "4194304", "set": False, "default": "4194304",
                                          "meaning": "chunk bytes of pipelined socket algorithms"}
    assert set(r["env"]) == {k.name for k in knobs.KNOBS}
    assert r["env_unknown"] == ["AIOCCL_TIMOUT"]
    assert "AIOCCL_TIMEOUT='abc' is not a number of seconds" in r["env_errors"]
    assert "AIOCCL_IB_SLOTS must be within [2, 1024], got 1" in r["env_errors"]
    assert "AIOCCL_FLIGHT_RECORDER='many' is not an integer" in r["env_errors"]  # and importing aioccl survived it
    assert "AIOCCL_GPU_SCRATCH must be at least 4096, got 1" in r["env_errors"]
    assert r["network"]["chosen"] == "127.0.0.1" and r["network"]["why"] == "AIOCCL_SOCKET_IFNAME==lo"
    assert {"name": "lo", "address": "127.0.0.1"} in r["network"]["interfaces"]
    assert r["shm"]["size_bytes"] > 0 and r["transports"]["tcp"] == "available"
    assert r["libraries"]["numpy"]["version"] == np.__version__
    for name in ("jax", "cupy", "torch", "anyio", "trio", "pyverbs"):
        lib = r["libraries"][name]
        assert lib["usable"] or lib["detail"], (name, lib)  # a reason whenever it cannot serve
    assert r["gpu"]["available"] or r["gpu"]["detail"]


def test_text_report_routes_to_the_root_and_flags_problems():
    p = info(AIOCCL_COMM_ID="127.0.0.1:29500", AIOCCL_SHM_DISABLE="1", AIOCCL_ALGOS="ring")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "a rank would use 127.0.0.1: the route to the root 127.0.0.1:29500" in out
    assert "transport shm: disabled by AIOCCL_SHM_DISABLE" in out
    assert "  * AIOCCL_SHM_DISABLE=1" in out and "    AIOCCL_TIMEOUT=300" in out
    assert "! AIOCCL_ALGOS is set but aioccl does not read it (a typo?)" in out
    assert re.search(r"shared memory: /dev/shm [\d.]+ GiB", out)


async def test_a_bad_knob_fails_communicator_creation_not_import(monkeypatch):
    import aioccl

    monkeypatch.setenv("AIOCCL_FLIGHT_RECORDER", "many")
    with pytest.raises(aioccl.InvalidArgument, match="AIOCCL_FLIGHT_RECORDER='many' is not an integer"):
        await aioccl.Communicator.create(aioccl.UniqueId.new(host="127.0.0.1"), 0, 1)


def test_cupy_is_found_under_any_of_its_distribution_names(monkeypatch):
    """cupy ships as cupy-cuda11x / 12x / 13x, cupy-rocm-* or cupy: the one that provides ``import cupy`` counts."""
    from importlib import metadata

    from aioccl.tools import info as info_mod

    versions = {"cupy-cuda13x": "14.2.0"}

    def version(name):
        if name in versions:
            return versions[name]
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "packages_distributions", lambda: {"cupy": ["cupy-cuda13x"]})
    monkeypatch.setattr(metadata, "version", version)
    assert info_mod._module_version("cupy") == "14.2.0"
    monkeypatch.setattr(metadata, "packages_distributions", lambda: {})
    assert info_mod._module_version("cupy") is None


def test_topology_outside_a_job_says_how_to_run_it_instead_of_a_traceback():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIOCCL_RANK", "AIOCCL_WORLD", "AIOCCL_COMM_ID"))}
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    p = subprocess.run([sys.executable, "-m", "aioccl.tools.info", "--topology"], capture_output=True, text=True,
                       timeout=60, env={**env, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "aioccl-run --nproc-per-node 2 aioccl-info --topology" in p.stderr, p.stderr
