"""The native GPU lane end to end without a GPU: the stand-in cupy (tests/fakecupy) drives the lane's driver
calls through tests/native/bridge_cuda.c, so every device-path op is launched by gpu_lane.c, a repeated call
runs from the call to the done Work in C, and the results come from the kernel's numpy meaning on the
stand-in's late streams. The same workers as on a GPU (scripts/gpu-check.sh), in both synchronisation
forms: exact results, the lane's share of the calls, a peer's mismatch, a deadline, an abort."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Any

import pytest
from test_gpu import FAKE, fakecupy_driver

from aioccl import native

from conftest import ROOT, launch

pytestmark = pytest.mark.skipif(native.core is None, reason=f"native core: {native.why_not}")


@pytest.fixture(autouse=True)
def _device_memory_of_ended_processes_goes():
    yield
    fakecupy_driver.reclaim()


@pytest.fixture(scope="module")
def bridge(tmp_path_factory: Any) -> dict[str, str]:
    return bridge_env(tmp_path_factory)


def bridge_env(tmp_path_factory: Any) -> dict[str, str]:
    """The bridge built, and the environment that makes a worker's stand-in cupy and GPU lane use it
    (test_xla_ffi_gpu.py's end-to-end test too)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler on this machine")
    so = tmp_path_factory.mktemp("bridge") / "libbridge_cuda.so"
    build = subprocess.run([cc, "-std=gnu17", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-O1",
                            str(ROOT / "tests" / "native" / "bridge_cuda.c"), "-o", str(so)],
                           capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    return {"PYTHONPATH": f"{ROOT}{os.pathsep}{FAKE}", "FAKECUPY_DRIVER": str(so), "AIOCCL_CUDA_DRIVER": str(so)}


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


@pytest.mark.parametrize("n, sync", [(2, "spin"), (3, "stream")])
def test_repeated_calls_run_in_the_lane_and_stay_exact(bridge, n, sync):
    out = _ok(launch(n, "gpu_lane.py", "3", timeout=240,
                     env={**bridge, "GPU_LANE_EXPECT": "1", "AIOCCL_GPU_SYNC": sync}))
    for r in range(n):
        m = re.search(rf"LANE_OK rank={r} checks=100 ran=(\d+)/90 path=ipc/{sync}", out)
        assert m is not None and int(m.group(1)) >= 45, out[-3000:]
        assert re.search(rf"LANE_HOST rank={r} .* native=on", out), out[-3000:]


@pytest.mark.parametrize("sync, stream, small", [("spin", "0", "0"), ("stream", "1", "0"), ("spin", "1", "4088")])
def test_every_op_and_dtype_through_the_lane(bridge, sync, stream, small):
    """gpu_ops.py at 3 ranks in many pieces (4 KiB scratch): every op and dtype exact, on the current stream
    or each op on a stream of its own, the ranks' mismatch caught on the device and named; and with the small
    all_reduce's one-block kernel (``gpu_small.cu``) launched by the lane for all_reduces up to 4088 bytes."""
    out = _ok(launch(3, "gpu_ops.py", "1", "7", "1500", timeout=240,
                     env={**bridge, "AIOCCL_GPU_SYNC": sync, "AIOCCL_GPU_SCRATCH": "4096", "GPU_OPS_STREAM": stream,
                          "AIOCCL_GPU_SMALL_BYTES": small}))
    for r in range(3):
        assert f"GPU_OK rank={r} " in out and f"path=ipc/{sync}" in out, out[-3000:]
    assert " 0 failures" in out and " 1 failures" not in out
    assert sum(f"GPU_MISMATCH rank={r}: " in out for r in range(3)) == 3, out[-3000:]


@pytest.mark.parametrize("sync", ["spin", "stream"])
def test_a_deadline_and_an_abort_through_the_lane(bridge, sync):
    out = _ok(launch(2, "gpu_timeout.py", timeout=120, env={**bridge, "AIOCCL_GPU_SYNC": sync}))
    assert "TIMEOUT_OK rank=0" in out and "TIMEOUT_OK rank=1" in out, out[-3000:]
    assert "timed out after 1s waiting for ranks [1]" in out, out[-3000:]
    proc = launch(2, "gpu_abort.py", timeout=120, env={**bridge, "AIOCCL_GPU_SYNC": sync})
    out = proc.stdout + proc.stderr
    assert "ABORT_OK rank=0 synchronised" in out and "ABORT_OK rank=1" in out, out[-3000:]

