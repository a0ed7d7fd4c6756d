"""The GPU path: lazy import, precise reasons, bookkeeping, and every op on GPU buffers across processes.

Three tiers, so this file says something on every machine:

* always: ``import aioccl`` never imports cupy; the reasons GPU features give
  when cupy or a driver is missing; pinned-pool, IPC-table and export
  bookkeeping with fake allocators;
* always: ``workers/gpu_ops.py`` (every op x every dtype, exact data) over
  real processes and the real host engine with ``tests/fakecupy`` standing
  in for cupy: the CUDA IPC exchange (device memory is /dev/shm there, so
  handles really cross processes) and the staged path, in many pieces;
* on a GPU: the same worker with the real cupy (skipped here with the probe's
  reason; ``scripts/gpu-check.sh`` runs it plus the benchmark).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

from aioccl.gpu.ipc import EXPORT_BYTES, Export, IpcTable
from aioccl.gpu.pinned import PinnedPool, size_class

from conftest import ROOT, launch

FAKE = str(ROOT / "tests" / "fakecupy")
_driver = importlib.util.spec_from_file_location("fakecupy_driver", f"{FAKE}/fakecupy_driver.py")
assert _driver is not None and _driver.loader is not None
fakecupy_driver = importlib.util.module_from_spec(_driver)
_driver.loader.exec_module(fakecupy_driver)


@pytest.fixture(autouse=True)
def _device_memory_of_ended_processes_goes():
    """As a driver frees a dead process's device memory: a rank a test killed leaves no segment behind."""
    yield
    fakecupy_driver.reclaim()


def _py(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def test_import_aioccl_never_imports_cupy():
    proc = _py("import sys, numpy as np, aioccl, aioccl.gpu, aioccl.buffers\n"
               "aioccl.buffers.adapt(np.zeros(3), 'x')\n"
               "print('cupy' in sys.modules)", env={"PYTHONPATH": f"{ROOT}{os.pathsep}{FAKE}"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_without_cupy_the_reason_says_how_to_get_it():
    code = ("import sys; sys.modules['cupy'] = None\n"
            "import aioccl, numpy as np\n"
            "print(aioccl.gpu.status().reason)\n"
            "class Cai:\n"
            "    __cuda_array_interface__ = {'shape': (2,), 'typestr': '<f4', 'data': (0, False), 'version': 3}\n"
            "try:\n"
            "    aioccl.buffers.adapt(Cai(), 'x')\n"
            "except aioccl.InvalidArgument as e:\n"
            "    print(e)\n")
    proc = _py(code)
    assert proc.returncode == 0, proc.stderr
    reason, refused = proc.stdout.strip().splitlines()
    assert reason.startswith("cupy is not installed") and "pip install 'aioccl[gpu]'" in reason
    assert refused.startswith("x (Cai, in GPU memory) needs the GPU path, which is unavailable: cupy is not installed")


def test_without_a_driver_the_reason_repeats_cudas():
    proc = _py("import aioccl; s = aioccl.gpu.status(); print(s.available, s.reason)",
               env={"PYTHONPATH": f"{ROOT}{os.pathsep}{FAKE}", "FAKECUPY_NO_DEVICE": "1"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ("False cupy 0-fake found no usable CUDA driver: cudaErrorNoDevice: no CUDA-capable "
                                   "device is detected")


def test_pinned_pool_reuses_blocks_only_after_their_event():
    allocated: list[ctypes.Array[ctypes.c_char]] = []
    freed: list[int] = []

    def alloc(n: int) -> int:
        allocated.append(ctypes.create_string_buffer(n))
        return ctypes.addressof(allocated[-1])

    class Ev:
        done = False

    pool = PinnedPool(alloc, freed.append)
    a = pool.take(5000)
    assert a.nbytes == size_class(5000) == 8192
    a.view(np.float32, 2048)[:] = 3  # the whole class is usable
    with pytest.raises(ValueError, match="does not fit"):
        a.view(np.float64, 1025)
    ev = Ev()
    pool.give_back(a, ev)
    b = pool.take(8000)
    assert b.ptr != a.ptr, "a block whose copy may still run was handed out again"
    ev.done = True
    c = pool.take(6000)
    assert c.ptr == a.ptr and len(allocated) == 2
    pool.give_back(b)
    assert pool.take(100).nbytes == 4096 and len(allocated) == 3
    assert pool.held_bytes == 8192 + 8192 + 4096
    pool.close()
    assert sorted(freed) == sorted(ctypes.addressof(x) for x in allocated)


def test_pinned_pool_never_hands_one_block_to_two_takers_at_once():
    """The caller's thread takes staging blocks at call time while the engine's thread takes and gives back
    others: without a lock, _reclaim's rebuilt list raced with give_back and put one block on the free list
    twice, so two ops staged through the same bytes (an int32 result holding another op's float64 bytes,
    seen on a GPU). Four threads, a tiny switch interval, every hand-out checked."""
    import sys
    import threading

    class Done:
        done = True

    addresses = iter(range(1 << 12, 1 << 40, 1 << 12))
    pool = PinnedPool(lambda n: next(addresses), lambda p: None)
    owned: set[int] = set()
    guard = threading.Lock()
    doubled: list[int] = []

    def use() -> None:
        for _ in range(5000):
            block = pool.take(100)
            with guard:
                if block.ptr in owned:
                    doubled.append(block.ptr)
                owned.add(block.ptr)
            with guard:
                owned.discard(block.ptr)
            pool.give_back(block, Done())

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=use) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not doubled, f"{len(doubled)} blocks handed to two takers at once"
    assert pool.held_bytes <= 4 * 4096  # no more blocks than takers at once


def test_ipc_export_round_trips_and_the_table_opens_each_handle_once():
    ex = Export(b"h" * 64, 64 << 20, 1234, 3)
    raw = ex.encode()
    assert len(raw) == EXPORT_BYTES and Export.decode(raw) == ex
    with pytest.raises(ValueError, match="bytes"):
        Export.decode(raw[:-1])
    opened: list[bytes] = []
    closed: list[int] = []

    def open_fn(h: bytes) -> int:
        opened.append(h)
        return 1000 * len(opened)

    table = IpcTable(1, 77, open_fn, closed.append)
    assert table.add(0, Export(b"a" * 64, 10, 1, 0)) == 1000
    assert table.add(1, Export(b"b" * 64, 10, 2, 0)) == 77  # its own scratch: used directly, never opened
    assert table.add(2, Export(b"a" * 64, 10, 1, 0)) == 1000  # the same allocation: no second open
    assert opened == [b"a" * 64] and table.opened == 1
    assert [table.ptr(r) for r in range(3)] == [1000, 77, 1000]

    def bad_close(ptr: int) -> None:
        raise RuntimeError("boom")

    table2 = IpcTable(0, 5, open_fn, bad_close)
    table2.add(1, Export(b"c" * 64, 10, 1, 0))
    assert [str(e) for e in table2.close()] == ["boom"]  # reported, not raised: close must finish
    assert table.close() == [] and closed == [1000]


def _run_fake(ipc: str, n: int = 3, counts: tuple[str, ...] = ("1", "7", "1500"), **env: str) -> str:
    proc = launch(n, "gpu_ops.py", *counts, timeout=240,
                  env={"PYTHONPATH": f"{ROOT}{os.pathsep}{FAKE}", "AIOCCL_GPU_IPC": ipc,
                       "AIOCCL_GPU_SCRATCH": "4096", "AIOCCL_GPU_STAGE_PIECE": "4096", **env})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    for r in range(n):
        assert f"GPU_OK rank={r} " in out, out[-3000:]
    assert f"path={'ipc' if ipc == '1' else 'staged'}" in out and " 0 failures" in out and " 1 failures" not in out
    assert sum(f"GPU_MISMATCH rank={r}: " in out for r in range(n)) == n, out[-3000:]
    return out


@pytest.mark.parametrize("ipc, path", [("1", "ipc"), ("0", "staged")])
def test_every_op_and_dtype_on_gpu_buffers_with_fakecupy(ipc, path):
    """Streams run late (0.5 ms by default): the H100's staged-path race failed here before its fix."""
    out = _run_fake(ipc)
    assert "never freed at exit" not in out, "close() must free the IPC scratch"
    if path == "staged":
        assert "GPU ops use staging through host memory: AIOCCL_GPU_IPC=0" in out


@pytest.mark.parametrize("ipc, n, delay_ms, sync", [("1", 4, "0", "spin"), ("0", 2, "3", "auto"),
                                                     ("0", 4, "0.2", "auto"), ("1", 2, "3", "stream")])
def test_every_op_on_its_own_stream_with_late_streams(ipc, n, delay_ms, sync):
    """Every op with ``stream=`` a non-blocking stream, many pieces, 2 and 4 ranks, streams from prompt to
    3 ms late; results are read on the default stream after it waited for ``work.event``, so an event
    recorded before the results fails here. The device path in both forms, the staged path with the
    form left to ``auto`` (which it does not use)."""
    out = _run_fake(ipc, n, ("1", "1500"), GPU_OPS_STREAM="1", FAKECUPY_DELAY_MS=delay_ms, AIOCCL_GPU_SYNC=sync)
    if ipc == "1":
        assert f"path=ipc/{sync}" in out


@pytest.mark.parametrize("n, delay_ms", [(2, "0"), (4, "0.5")])
def test_small_all_reduces_in_one_block_of_ll_lines_with_fakecupy(n, delay_ms):
    """``AIOCCL_GPU_SMALL_BYTES``: all_reduces up to 4088 bytes run ``gpu_small.cu`` (its numpy meaning here)
    between the piece kernel's ops, sharing their epochs: every op and dtype exact, the mismatch of one op
    against another caught on every rank."""
    _run_fake("1", n, ("1", "7", "1500"), AIOCCL_GPU_SYNC="spin", AIOCCL_GPU_SMALL_BYTES="4088",
              FAKECUPY_DELAY_MS=delay_ms)


def test_the_stand_ins_streams_run_late_so_each_careless_pattern_reads_wrong_bytes():
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "workers" / "late_streams.py")], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": FAKE, "FAKECUPY_DELAY_MS": "5"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert set(lines) == {"missing_wait_on_the_producers_stream", "reading_a_host_buffer_before_its_event",
                          "reusing_a_pinned_buffer_while_its_copy_is_queued", "completing_before_the_results_land",
                          "default_stream_read_after_a_non_blocking_writer", "stream_order_is_kept"}, proc.stdout
    for case, got in lines.items():
        want = "careless=right careful=right" if case == "stream_order_is_kept" else "careless=wrong careful=right"
        assert got == want, (case, got)


def test_torch_cuda_tensors_are_viewed_in_place_and_ordered_on_torchs_stream():
    """What aioccl reads of a torch CUDA tensor, on the stand-in (the run against Gloo on real CUDA tensors
    is ``torch_c10d.py cuda``: tests/test_torch_backend.py on a GPU machine, and scripts/gpu-check.sh)."""
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "workers" / "torch_cuda_standin.py")],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{FAKE}"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "TORCHCUDA OK 8" in proc.stdout


def test_jax_ext_gpu_callback_views_xla_buffers_and_uses_its_stream():
    proc = launch(2, "jax_gpu_callback.py", timeout=240, env={"PYTHONPATH": f"{ROOT}{os.pathsep}{FAKE}"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert proc.stdout.count("JAXGPU OK 8") == 2, proc.stdout


def _gpu_reason() -> str:
    proc = _py("import aioccl; s = aioccl.gpu.status(); print(int(s.available), s.reason)")
    ok, _, reason = proc.stdout.strip().partition(" ")
    return "" if ok == "1" else reason or proc.stderr.strip()[-300:]


@pytest.mark.skipif(bool(_gpu_reason()), reason=f"no GPU: {_gpu_reason()}")
def test_every_op_and_dtype_on_a_real_gpu():
    proc = launch(2, "gpu_ops.py", timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert out.count("GPU_OK") == 2


@pytest.mark.skipif(bool(_gpu_reason()), reason=f"no GPU: {_gpu_reason()}")
def test_jax_on_a_real_gpu():
    proc = launch(2, "jax_process.py", timeout=600,
                  env={"JAX_PLATFORMS": "cuda", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert proc.stdout.count("JAXP OK") == 2


def test_aioccl_info_prints_the_gpu_reason():
    proc = subprocess.run([sys.executable, "-m", "aioccl.tools.info"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{FAKE}", "FAKECUPY_NO_DEVICE": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "gpu: unavailable: cupy 0-fake found no usable CUDA driver: cudaErrorNoDevice" in proc.stdout
    assert "transport shm: " in proc.stdout


@pytest.mark.parametrize("sync, small", [("spin", "0"), ("stream", "0"), ("spin", "4088")])
def test_a_gpu_op_one_rank_never_issues_ends_at_its_deadline_and_the_next_op_names_the_rank(sync, small):
    proc = launch(2, "gpu_timeout.py", timeout=120,
                  env={"PYTHONPATH": f"{ROOT}{os.pathsep}{FAKE}", "AIOCCL_GPU_SYNC": sync,
                       "AIOCCL_GPU_SMALL_BYTES": small})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "TIMEOUT_OK rank=0" in out and "TIMEOUT_OK rank=1" in out, out[-3000:]
    assert "timed out after 1s waiting for ranks [1]" in out, out[-3000:]


@pytest.mark.parametrize("sync, small", [("spin", "0"), ("stream", "0"), ("spin", "4088")])
def test_abort_frees_a_gpu_op_waiting_for_a_peer_that_never_comes(sync, small):
    proc = launch(2, "gpu_abort.py", timeout=120,
                  env={"PYTHONPATH": f"{ROOT}{os.pathsep}{FAKE}", "AIOCCL_GPU_SYNC": sync,
                       "AIOCCL_GPU_SMALL_BYTES": small})
    out = proc.stdout + proc.stderr
    assert "ABORT_OK rank=0 synchronised" in out and "ABORT_OK rank=1" in out, out[-3000:]


def test_the_gpu_lane_worker_with_fakecupy_repeated_calls_stay_exact():
    """tests/workers/gpu_lane.py (what scripts/gpu-check.sh runs on a GPU, where the native lane takes the
    repeated calls) on the stand-in: every repeated op exact through the general way, from two streams and
    a second thread. Here there is no CUDA driver, so the lane is not made and says why."""
    proc = launch(2, "gpu_lane.py", "3", timeout=240,
                  env={"PYTHONPATH": f"{ROOT}{os.pathsep}{FAKE}", "AIOCCL_DEBUG": "INFO", "AIOCCL_DEBUG_SUBSYS": "GPU"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    for r in range(2):
        assert f"LANE_OK rank={r} checks=99 ran=0/90 path=ipc/" in out, out[-3000:]
    assert "GPU ops launch from Python: " in out, out[-3000:]
