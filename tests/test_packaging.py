"""What a user installs: ``python -m build`` makes an sdist, then the wheel from the sdist (as PyPI's users get
it from either), and the wheel installs into a fresh venv and works: one native build proves both artifacts.

(Folded, issue 75: "the sdist installs into a fresh venv and runs" built the core a second time from the same
sdist through the same PEP 517 backend; the wheel built from that sdist, installed and run, is that check.)"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

import aioccl

from conftest import ROOT

SMOKE = """
import asyncio, numpy as np, aioccl
assert aioccl.__version__ == {version!r}, aioccl.__version__

async def main():
    uid = aioccl.UniqueId.new(host="127.0.0.1")
    comms = await asyncio.gather(*(aioccl.Communicator.create(uid, r, 2, timeout=30) for r in range(2)))
    xs = [np.arange(5, dtype=np.int32) * (c.rank + 1) for c in comms]
    await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, xs)))
    assert all(x.tolist() == [0, 3, 6, 9, 12] for x in xs), xs
    await asyncio.gather(*(c.close() for c in comms))
    assert aioccl.native.core is not None, aioccl.native.status()  # the native core was built and loads
    assert all(c._state.shm.native.stats["ops"] > 0 or c._cpu.native is not None for c in comms)
    print("smoke ok", aioccl.__file__)

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """Built once per run, under a lock: xdist workers that each ran the module's tests built in the same
    source tree at once, and the two builds' egg-info clashed ("No such file or directory"). The wheel is built
    from the sdist (``build``'s default), so the sdist's contents are what the wheel's build had."""
    shared = tmp_path_factory.getbasetemp().parent  # the same for every worker of this run
    out = shared / "dist"
    with open(shared / "dist.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "built").exists():
            out.mkdir(exist_ok=True)
            p = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
                               capture_output=True, text=True, timeout=300)
            assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
            # (build's own "Building wheel from sdist" line goes to its logger only on a terminal; the wheel's
            # build ran in the folder build unpacks the sdist into)
            assert "build-via-sdist-" in p.stdout + p.stderr, p.stdout[-3000:]
            (out / "built").touch()
    return out


def test_wheel_and_sdist_contents(dist):
    v = aioccl.__version__
    wheel, = dist.glob(f"aioccl-{v}-cp*.whl")  # a platform wheel: it holds the native core
    names = set(zipfile.ZipFile(wheel).namelist())
    for must in ("aioccl/__init__.py", "aioccl/py.typed", "jax_ext/py.typed", "aioccl/transport/ib/protocol.py",
                 "aioccl/tensors.py", "aioccl/tools/info.py", "aioccl/native/__init__.py", "aioccl/native/_core.pyi",
                 "aioccl/kernels/gpu_piece.cu", "aioccl/kernels/gpu_piece.cuh",
                 "aioccl/native/README.md"):
        assert must in names, must
    assert any(n.startswith("aioccl/native/_core.") and n.endswith(".so") for n in names), sorted(names)[:20]
    assert not any(n.startswith(("tests/", "examples/", "aioccl/native/src/")) for n in names)
    meta = zipfile.ZipFile(wheel).read(f"aioccl-{v}.dist-info/METADATA").decode()
    assert f"Version: {v}" in meta and "Provides-Extra: torch" in meta and "Provides-Extra: gpu" in meta
    entry = zipfile.ZipFile(wheel).read(f"aioccl-{v}.dist-info/entry_points.txt").decode()
    for script in ("aioccl-run", "aioccl-perf", "aioccl-info", "aioccl-sim"):
        assert script in entry
    sdist, = dist.glob(f"aioccl-{v}.tar.gz")
    with tarfile.open(sdist) as tar:
        members = set(tar.getnames())
    assert f"aioccl-{v}/pyproject.toml" in members and f"aioccl-{v}/aioccl/py.typed" in members
    for src in ("CMakeLists.txt", "aioccl/native/src/core/channel.c", "aioccl/native/src/core/launch.c",
                "aioccl/native/src/py/fast_lane.c"):
        assert f"aioccl-{v}/{src}" in members, src  # a build from the sdist compiles the core


def test_the_wheel_built_from_the_sdist_installs_into_a_fresh_venv_and_runs(dist, tmp_path):
    package, = dist.glob("aioccl-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    # (not AIOCCL_NATIVE either: the installed copy must build and load its native core)
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "AIOCCL_NATIVE")}
    p = subprocess.run([str(py), "-m", "pip", "install", "--quiet", str(package)], capture_output=True, text=True,
                       timeout=300, env=clean)
    assert p.returncode == 0, p.stderr[-3000:]
    p = subprocess.run([str(py), "-c", SMOKE.format(version=aioccl.__version__)], capture_output=True, text=True,
                       timeout=120, env=clean, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "smoke ok" in p.stdout and str(env_dir) in p.stdout  # the installed copy, not the checkout
    p = subprocess.run([str(env_dir / "bin" / "aioccl-info"), "--json"], capture_output=True, text=True,
                       timeout=120, env=clean, cwd=tmp_path)
    assert p.returncode == 0 and '"aioccl": "' + aioccl.__version__ in p.stdout, p.stderr[-2000:]
