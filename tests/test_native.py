"""The native core (aioccl/native): loaded, bit-identical to the Python path, memory-safe under the
sanitizers and hostile shared memory, interoperable with ranks on the Python path, and the GIL free
while it waits. The multi-rank matrix runs it both ways (test_collectives_multiprocess.py)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import aioccl
from aioccl import native
from aioccl.dtypes import SUPPORTED_DTYPES, ReduceOp, dtype_code
from aioccl.errors import CollectiveMismatch

from conftest import close_all, launch, make_comms

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "aioccl" / "native" / "src"
pytestmark = pytest.mark.skipif(native.core is None, reason=f"native core: {native.status()}")


def test_the_core_is_loaded_and_aioccl_info_says_so():
    out = subprocess.run([sys.executable, "-m", "aioccl.tools.info"], capture_output=True, text=True, timeout=120)
    assert "native core: loaded (_core." in out.stdout, out.stdout[:500]


def test_the_switch_and_a_missing_module_take_the_python_path_with_one_warning():
    code = ("import asyncio, sys, numpy as np\n"
            "if sys.argv[1] == 'missing': sys.modules['aioccl.native._core'] = None\n"
            "import aioccl, aioccl.native as n\n"
            "sys.path.insert(0, 'tests')\n"
            "from conftest import make_comms, close_all\n"
            "async def main():\n"
            "    comms = await make_comms(2)\n"
            "    xs = [np.full(3, c.rank + 1, np.int32) for c in comms]\n"
            "    await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, xs)))\n"
            "    print(n.status(), [x.tolist() for x in xs], [c._cpu.native is None for c in comms])\n"
            "    await close_all(comms)\n"
            "asyncio.run(main())\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    off = subprocess.run([sys.executable, "-c", code, "off"], env={**env, "AIOCCL_NATIVE": "0"}, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert "not loaded: switched off by AIOCCL_NATIVE=0 [[3, 3, 3], [3, 3, 3]] [True, True]" in off.stdout, off
    assert "native core unavailable" not in off.stderr, off.stderr
    gone = subprocess.run([sys.executable, "-c", code, "missing"], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert "[[3, 3, 3], [3, 3, 3]] [True, True]" in gone.stdout, gone
    assert gone.stderr.count("native core unavailable") == 1, gone.stderr
    assert "could not be loaded" in gone.stderr and "reinstall aioccl" in gone.stderr, gone.stderr


@pytest.mark.parametrize("native_on", ["1", "0"])
def test_awaiting_a_work_gives_the_same_on_either_path(native_on):
    """A done Work's result, a failed one's error, one done later on another thread, the loop's other tasks
    run while done Works are awaited back to back, and the awaitable driven by hand: the core's Awaiting
    (awaiting.c) and work.py's Python one (tests/workers/awaiting.py)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AIOCCL_NATIVE": native_on}
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "workers" / "awaiting.py")], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    base = "Awaiting" if native_on == "1" else "_AwaitingInPython"
    assert f"AWAITING OK base={base}" in p.stdout, p.stdout[-2000:] + p.stderr[-3000:]


def _specials(dt: np.dtype, n: int, rng: np.random.Generator) -> np.ndarray:
    if dt.kind in "iu":
        info = np.iinfo(dt)
        edge = np.array([info.min, info.max, 0, 1, info.max // 2 + 1], dtype=dt)
        return np.concatenate([edge, rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)])
    wide = np.array([0.0, -0.0, 1.0, -1.5, np.inf, -np.inf, 6.0e-8, 1e-40, 3.0e38, 65504.0, 1e5, 0.1, 1 / 3])
    vals = np.concatenate([wide, rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n)])
    with np.errstate(over="ignore"):
        return vals.astype(dt)


@pytest.mark.parametrize("dt", SUPPORTED_DTYPES, ids=lambda d: d.name)
def test_every_reduction_is_bit_identical_to_numpy(dt):
    """The core's combine and scale against numpy's ufuncs (ml_dtypes' for bfloat16), every element's bits,
    with infinities, signed zeros, subnormals and overflow among them (NaN: the same canonical results)."""
    rng = np.random.default_rng(7)
    a, b = _specials(dt, 4000, rng), _specials(dt, 4000, rng)[::-1].copy()
    if dt.kind == "f" or dt == np.dtype(ml_dtypes.bfloat16):
        a[::97] = np.nan
    bits = np.dtype(f"u{dt.itemsize}")
    ops = {ReduceOp.SUM: np.add, ReduceOp.PROD: np.multiply, ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum}
    for op, ufunc in ops.items():
        want = np.empty_like(a)
        with np.errstate(all="ignore"):
            ufunc(a, b, out=want)
        got = np.full_like(a, 7)
        native.core.combine(op.code, dtype_code(dt), got, a, b)
        same = got.view(bits) == want.view(bits)
        if dt.kind == "f" or dt == np.dtype(ml_dtypes.bfloat16):
            same |= np.isnan(got.astype(np.float64)) & np.isnan(want.astype(np.float64))
        assert same.all(), (op, np.flatnonzero(~same)[:5], got[~same][:5], want[~same][:5])
    if dt.kind == "f" or dt == np.dtype(ml_dtypes.bfloat16):
        for n in (2, 3, 7):
            want = a.copy()
            with np.errstate(all="ignore"):
                np.divide(want, n, out=want, casting="unsafe")
            got = a.copy()
            native.core.scale(dtype_code(dt), got, n)
            nan = np.isnan(got.astype(np.float64)) & np.isnan(want.astype(np.float64))
            same = (got.view(bits) == want.view(bits)) | nan
            assert same.all(), (n, got[~same][:5], want[~same][:5])


def test_the_core_under_address_and_undefined_behaviour_sanitizers(tmp_path):
    """The protocol (ranks as threads), the fuzzers of every reader of shared memory, and the float16/bfloat16
    conversions, built with -fsanitize=address,undefined: any read outside a mapping or UB fails the run."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler on this machine")
    exe = tmp_path / "check_core"
    build = subprocess.run([cc, "-std=gnu17", "-Wall", "-Wextra", "-Werror", "-fsanitize=address,undefined",
                            "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g", "-O1", f"-I{SRC / 'core'}",
                            *map(str, sorted((SRC / "core").glob("*.c"))),
                            str(ROOT / "tests" / "native" / "check_core.c"),
                            str(ROOT / "tests" / "native" / "check_launch.c"),
                            str(ROOT / "tests" / "native" / "check_fifo.c"), "-lpthread", "-lm", "-ldl",
                            "-o", str(exe)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    from test_gpu_lane import build_standin

    standin = tmp_path / "libstandin_cuda.so"
    build_standin(cc, standin)
    run = subprocess.run([str(exe), "20000", str(standin)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0"})
    assert run.returncode == 0 and "native core checks passed" in run.stdout, run.stdout + run.stderr
    assert "launcher checks passed" in run.stdout, run.stdout
    assert "fifo stream: 20000 frames" in run.stdout and "fuzz fifo: 20000 runs" in run.stdout, run.stdout
    assert "fifo want: 20000 messages" in run.stdout, run.stdout
    assert "runtime error" not in run.stderr and "AddressSanitizer" not in run.stderr, run.stderr


def test_the_module_under_the_sanitizers_through_real_collectives(tmp_path):
    """The extension itself (the CPython glue too: Program, Channel, Lane, the XLA FFI handlers, the GPU lane)
    built with -fsanitize=address,undefined and loaded into Python under AddressSanitizer, through every
    collective on 1 to 3 ranks, the fast lane, a mismatch, jitted jax_ext ops run by its custom calls, and the
    GPU lane's tests against the stand-in CUDA driver."""
    cc = shutil.which("gcc")
    asan = subprocess.run([cc or "gcc", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    ubsan = subprocess.run([cc or "gcc", "-print-file-name=libubsan.so"], capture_output=True, text=True).stdout.strip()
    if cc is None or not os.path.isabs(asan) or not os.path.isabs(ubsan):
        pytest.skip("no gcc with AddressSanitizer's runtime on this machine")
    import sysconfig

    so = tmp_path / f"_core{sysconfig.get_config_var('EXT_SUFFIX')}"
    import jax.ffi

    build = subprocess.run([cc, "-std=gnu17", "-Wall", "-Wextra", "-Werror", "-fsanitize=address,undefined",
                            "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g", "-O1", "-shared", "-fPIC",
                            f"-I{sysconfig.get_paths()['include']}", f"-I{np.get_include()}",
                            f"-I{jax.ffi.include_dir()}", "-DAIOCCL_XLA_FFI=1", f"-I{SRC}",
                            *map(str, sorted(SRC.glob("*/*.c"))), "-o", str(so)], capture_output=True, text=True,
                           timeout=300)
    assert build.returncode == 0, build.stderr
    env = {**os.environ, "LD_PRELOAD": f"{asan} {ubsan}", "ASAN_OPTIONS": "detect_leaks=0",
           "PYTHONMALLOC": "malloc", "PYTHONPATH": str(ROOT), "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    from test_gpu_lane import build_standin
    from test_xla_ffi_gpu import build_frame

    standin, frame = tmp_path / "libstandin_cuda.so", tmp_path / "libffi_frame.so"
    build_standin(cc, standin)
    build_frame(cc, frame)
    script = ROOT / "tests" / "native" / "sanitized_module.py"
    run = subprocess.run([sys.executable, str(script), str(so), str(standin), str(frame)],
                         capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert run.returncode == 0 and "sanitized module ok" in run.stdout, run.stdout[-2000:] + run.stderr[-3000:]
    assert "runtime error" not in run.stderr and "AddressSanitizer" not in run.stderr, run.stderr[-3000:]


async def _every_collective(comms: list[aioccl.Communicator], dt: np.dtype) -> None:
    n = len(comms)
    one = [np.full(5, c.rank + 1, dt) for c in comms]
    await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, one, strict=True)))
    assert all((x == n * (n + 1) // 2).all() for x in one)
    outs = await asyncio.gather(*(c.all_gather(np.full(3, c.rank, dt)) for c in comms))
    assert all((o == np.repeat(np.arange(n), 3).astype(dt)).all() for o in outs)
    blocks = [np.arange(2 * n, dtype=dt) + c.rank for c in comms]
    outs = await asyncio.gather(*(c.reduce_scatter(b, out=np.full(2, 99, dt)) for c, b in zip(comms, blocks,
                                                                                          strict=True)))
    for r, o in enumerate(outs):
        assert (o == sum(np.arange(2 * n, dtype=np.int64)[2 * r:2 * r + 2] + j for j in range(n))).all(), (r, o)
    bc = [np.full(4, 9 if c.rank == 1 else 0, dt) for c in comms]
    await asyncio.gather(*(c.broadcast(x, root=1) for c, x in zip(comms, bc, strict=True)))
    assert all((x == 9).all() for x in bc)
    scans = [np.full(3, c.rank + 1, dt) for c in comms]
    await asyncio.gather(*(c.scan(x) for c, x in zip(comms, scans, strict=True)))
    assert all((x == (r + 1) * (r + 2) // 2).all() for r, x in enumerate(scans))
    a2a = [np.arange(n, dtype=dt) + 10 * c.rank for c in comms]
    await asyncio.gather(*(c.all_to_all(x) for c, x in zip(comms, a2a, strict=True)))
    assert all((x == np.arange(n) * 10 + r).all() for r, x in enumerate(a2a))
    await asyncio.gather(*(c.barrier() for c in comms))


@pytest.mark.parametrize("n", [2, 3])
async def test_ranks_on_the_native_and_the_python_path_meet(n):
    """One rank takes the Python executor, the others the core: the protocol, the descriptors and the
    reduction order are the same, so every collective is exact; then all native."""
    comms = await make_comms(n)
    try:
        slow = comms[0]
        slow._state.native_max = -1  # nothing lowered: the Python executor runs its ops
        slow._planner.forget()
        for dt in (np.dtype(np.int32), np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16)):
            await _every_collective(comms, dt)
        assert slow._state.shm.native.stats["ops"] == 0
        assert all(c._state.shm.native.stats["ops"] > 10 for c in comms[1:])
        slow._state.native_max = 1 << 20
        slow._planner.forget()
        await _every_collective(comms, np.dtype(np.float64))
        assert slow._state.shm.native.stats["ops"] > 0
    finally:
        await close_all(comms)


@pytest.mark.parametrize("n", [2, 3])
async def test_buffers_read_in_place_on_either_path(n, monkeypatch):
    """Every buffer offered for reading in place (``AIOCCL_SHM_CMA_MIN_BYTES=1``): the native ranks put their
    buffers' addresses in the descriptor and skip staging them, and every reader, the Python executor's
    too, copies them with process_vm_readv: every collective exact with one rank on the Python path (it
    reads, it offers nothing, so a native broadcast root writes nothing into it), then all native (the
    root writes part of each receiver's copy); and with ``AIOCCL_SHM_CMA=0`` nobody reads in place."""
    monkeypatch.setenv("AIOCCL_SHM_CMA_MIN_BYTES", "1")
    comms = await make_comms(n)
    try:
        assert all(c._state.shm.readers is not None for c in comms)
        slow = comms[0]
        slow._state.native_max = -1  # nothing lowered: the Python executor runs its ops
        slow._planner.forget()
        for dt in (np.dtype(np.int32), np.dtype(np.float32)):
            await _every_collective(comms, dt)
        assert slow._state.shm.native.stats["ops"] == 0 and slow._state.shm.stats["cma_reads"] > 0
        assert n == 2 or all(c._state.shm.native.stats["cma_reads"] > 0 for c in comms[1:])  # (rank 0 offers nothing)
        slow._state.native_max = 1 << 20
        slow._planner.forget()
        await _every_collective(comms, np.dtype(np.float64))
        assert all(c._state.shm.native.stats["cma_reads"] > 0 for c in comms)
        # the broadcast's root (rank 1, in place) wrote the back of each chunk into its receivers' buffers
        assert comms[1]._state.shm.native.stats["cma_writes"] > 0
        big = [np.arange(300_000, dtype=np.float32) % 13 + c.rank for c in comms]  # pieces of a reduction
        await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, big, strict=True)))
        want = (np.arange(300_000, dtype=np.float32) % 13) * n + n * (n - 1) // 2
        assert all((x == want).all() for x in big)
    finally:
        await close_all(comms)
    monkeypatch.setenv("AIOCCL_SHM_CMA", "0")
    comms = await make_comms(n)
    try:
        assert all(c._state.shm.readers is None for c in comms)
        await _every_collective(comms, np.dtype(np.int32))
        assert all(c._state.shm.counts()["cma_reads"] == 0 for c in comms)
    finally:
        await close_all(comms)


async def test_a_mismatch_on_the_native_path_fails_every_rank_and_the_next_op_is_exact():
    comms = await make_comms(2)
    try:
        for c in comms:  # learn the call: the fast lane takes it from now on
            await asyncio.gather(*(c.all_reduce(np.ones(4, np.float32)) for c in comms))
        xs = [np.ones(4 + c.rank, np.float32) for c in comms]
        got = await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, xs, strict=True)), return_exceptions=True)
        assert all(isinstance(e, CollectiveMismatch) for e in got), got
        assert all("rank 1 issued all_reduce" in str(e) or "rank 0 issued all_reduce" in str(e) for e in got), got
        ys = [np.full(4, c.rank + 1, np.float32) for c in comms]
        await asyncio.gather(*(c.all_reduce(y) for c, y in zip(comms, ys, strict=True)))
        assert all((y == 3).all() for y in ys)
    finally:
        await close_all(comms)


async def test_the_fast_lane_records_its_ops_and_keeps_the_order_of_a_group():
    comms = await make_comms(2)
    try:
        xs = [np.ones(2, np.int64) for _ in comms]
        for _ in range(3):
            await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, xs, strict=True)))
        assert all((x == 8).all() for x in xs)
        assert all(c._state.shm.native.stats["ops"] >= 2 for c in comms)
        assert "all_reduce seq 2 (2 x int64, sum)" in comms[0].recent()[-1], comms[0].recent()
        assert comms[0].pending() == []

        async def grouped(c: aioccl.Communicator, x: np.ndarray, y: np.ndarray) -> None:
            async with c.group():  # launched together at the exit: the lane stays out of it
                c.all_reduce(x)
                c.all_reduce(y, op="max")

        a = [np.full(2, c.rank + 1, np.int64) for c in comms]
        b = [np.full(2, c.rank + 5, np.int64) for c in comms]
        await asyncio.gather(*(grouped(c, x, y) for c, x, y in zip(comms, a, b, strict=True)))
        assert all((x == 3).all() for x in a) and all((y == 6).all() for y in b)
    finally:
        await close_all(comms)


def test_another_thread_runs_while_a_native_op_waits():
    """The GIL is released for the whole wait: rank 0's other thread keeps >= half the pace it has beside a
    main thread busy without the GIL, while rank 0 waits (spinning in the core, AIOCCL_SHM_SPIN_US long) for a
    rank that comes 0.25 s late. A wait that held the GIL would leave it ~0; it keeps ~0.95 on an idle machine
    and under two busy loops, and half leaves room for the bursts of a loaded one (once seen below 0.8)."""
    proc = launch(2, "native_gil.py", env={"AIOCCL_SHM_SPIN_US": "1000000"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    line = next(ln for ln in proc.stdout.splitlines() if "GIL idle" in ln)
    ratio, ops = float(line.split("ratio ")[1].split()[0]), int(line.rsplit(" ", 1)[1])
    assert ops >= 5 and ratio >= 0.5, line


async def test_bad_input_is_refused_before_anything_is_sent_and_the_lane_goes_on():
    """What the fast lane does not take goes the general way, which raises before taking a sequence number;
    the next op is exact on every rank."""
    comms = await make_comms(2)
    try:
        xs = [np.ones(3, np.float32) for _ in comms]
        for _ in range(2):
            await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, xs, strict=True)))
        c = comms[0]
        seq = c._seq
        bad = [((np.ones(3, np.int16),), {}), ((np.ones(3, np.float32),), {"op": "bogus"}),
               ((np.ones(3, np.int32),), {"op": "avg"}), ((np.ones(3, np.float32),), {"timeout": -1}),
               ((np.ones(6, np.float32)[::2],), {}), (([1.0, 2.0],), {"out": np.ones(3, np.float32)})]
        ro = np.ones(3, np.float32)
        ro.flags.writeable = False
        bad.append(((ro,), {}))
        for args, kwargs in bad:
            with pytest.raises(aioccl.InvalidArgument):
                c.all_reduce(*args, **kwargs)
        assert c._seq == seq, "a refused call took a sequence number"
        ys = [np.full(3, r + 1, np.float32) for r in range(2)]
        await asyncio.gather(*(c.all_reduce(y) for c, y in zip(comms, ys, strict=True)))
        assert all((y == 3).all() for y in ys)
    finally:
        await close_all(comms)


async def test_a_closed_communicator_and_its_lane_are_collected():
    """The lane and its communicator refer to each other: the cycle collector must free both once closed
    (an app that splits and closes communicators in a loop must not grow)."""
    import gc
    import weakref

    comms = await make_comms(2)
    xs = [np.ones(3, np.float32) for _ in comms]
    for _ in range(2):
        await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, xs, strict=True)))
    assert all(c._cpu.native is not None for c in comms)
    refs = [weakref.ref(c) for c in comms]
    await close_all(comms)
    del comms, xs
    for _ in range(3):
        gc.collect()
        await asyncio.sleep(0.05)
    assert [r() is None for r in refs] == [True] * len(refs)
