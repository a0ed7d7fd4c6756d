"""The GPU's reduction arithmetic, checked without a GPU.

The device functions that ``aioccl.kernels.gpu`` generates (and the piece
kernel calls) are valid C as well, by design: gcc compiles the very same
strings into a shared library here and every (op, dtype) pair runs against
numpy on edge cases (wrap-around, NaN, every bfloat16 and float16 rounding
case sampled), compared bit for bit. float16's conversions are PTX on the
GPU; here C's ``_Float16`` conversions stand in, which round the same way
(to nearest even). NVRTC compiles the PTX in tests/test_gpu_piece.py, and
scripts/gpu-check.sh runs it on a GPU.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
import zlib

import ml_dtypes
import numpy as np
import pytest

from aioccl.dtypes import SUPPORTED_DTYPES, ReduceOp, is_float
from aioccl.kernels import cpu
from aioccl.kernels.gpu import (
    BF16,
    BF16_CONVERT,
    C_TYPES,
    COMBINES,
    combine_op,
    device_functions,
    function_names,
    storage_dtype,
)

# float16 <-> float for gcc, in place of the kernel's PTX cvt (cvt.rn rounds to nearest even, as C does)
HALF_IN_C = """
static float aioccl_h2f(unsigned short h) { _Float16 x; __builtin_memcpy(&x, &h, 2); return (float)x; }
static unsigned short aioccl_f2h(float f) { _Float16 x = (_Float16)f; unsigned short h; __builtin_memcpy(&h, &x, 2);
                                            return h; }
"""
pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or sys.platform != "linux",
                                reason="needs gcc (x86-64 Linux, for _Float16) to compile the kernel source as C")


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    d = tmp_path_factory.mktemp("kernels")
    parts = ["#define __device__ static", "#define __forceinline__ inline", HALF_IN_C, BF16_CONVERT]
    for dt in SUPPORTED_DTYPES:
        t = C_TYPES[dt][0]
        for op in COMBINES:
            comb, scale = function_names(op, dt)
            parts.append(device_functions(op, dt))
            parts.append(f"void loop_{comb}(const {t}* A, const {t}* B, {t}* C, long n) {{\n"
                         f"  for (long i = 0; i < n; i++) C[i] = {comb}(A[i], B[i]);\n}}")
            parts.append(f"void loop_{scale}(double n, {t}* C, long len) {{\n"
                         f"  for (long i = 0; i < len; i++) C[i] = {scale}(C[i], n);\n}}")
    src = d / "kernels.c"
    src.write_text("\n".join(parts) + "\n")
    so = d / "kernels.so"
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-fno-fast-math", "-o", str(so), str(src)], check=True)
    return ctypes.CDLL(str(so))


def _samples(dt: np.dtype, rng: np.random.Generator, n: int = 4096) -> np.ndarray:
    """Edge cases first, then random bit patterns (floats) or the full range (integers)."""
    if dt.kind in "iu":
        info = np.iinfo(dt)
        edges = np.array([0, 1, info.max, info.min, info.max - 1, info.min + 1], dtype=dt)
        rand = rng.integers(info.min, info.max, size=n, dtype=dt, endpoint=True)
        return np.concatenate([edges, rand])
    bits = np.dtype(f"u{dt.itemsize}")
    raw = rng.integers(0, np.iinfo(bits).max, size=n, dtype=bits, endpoint=True).view(dt)
    edges = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 3.0, 0.5], dtype=dt)
    small = rng.integers(-50, 50, size=n).astype(dt)  # exact sums and products, the tests' kind of data
    return np.concatenate([edges, raw, small])


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    if is_float(want.dtype):
        with np.errstate(invalid="ignore"):
            gnan, wnan = np.isnan(got.astype(np.float64)), np.isnan(want.astype(np.float64))
        assert (gnan == wnan).all(), np.flatnonzero(gnan != wnan)[:5]
        got, want = got[~wnan], want[~wnan]
    bits = np.dtype(f"u{want.dtype.itemsize}")
    bad = np.flatnonzero(got.view(bits) != want.view(bits))
    assert bad.size == 0, (bad[:5], got[bad[:5]], want[bad[:5]])


@pytest.mark.parametrize("op", list(ReduceOp), ids=lambda o: o.value)
@pytest.mark.parametrize("dt", SUPPORTED_DTYPES, ids=lambda d: d.name)
def test_combine_kernel_source_matches_numpy_bit_for_bit(lib, dt, op):
    if op is ReduceOp.AVG and not is_float(dt):
        pytest.skip("integer avg is refused before any kernel runs")
    rng = np.random.default_rng(zlib.crc32(f"{dt.name} {op.value}".encode()))  # hash() differs per process
    a, b = _samples(dt, rng), _samples(dt, rng)[::-1].copy()
    if is_float(dt):  # every pairing of the signed zeros, where min and max tie
        a = np.concatenate([a, np.array([0.0, -0.0, 0.0, -0.0], dtype=dt)])
        b = np.concatenate([b, np.array([-0.0, 0.0, 0.0, -0.0], dtype=dt)])
    want = np.empty_like(a)
    with np.errstate(all="ignore"):
        cpu.combine(op, want, a, b)
    sd = storage_dtype(dt)
    got = np.full(a.size, 0x5A, dtype=np.uint8).repeat(dt.itemsize).view(sd)  # poisoned
    fn = getattr(lib, "loop_" + function_names(combine_op(op), dt)[0])
    fn(a.view(sd).ctypes.data_as(ctypes.c_void_p), b.view(sd).ctypes.data_as(ctypes.c_void_p),
       got.ctypes.data_as(ctypes.c_void_p), ctypes.c_long(a.size))
    got = got.view(dt)
    if is_float(dt) and op in (ReduceOp.MIN, ReduceOp.MAX):
        # +0 against -0 is a tie whose sign IEEE 754 leaves open, and numpy answers it differently per dtype
        # (float16 keeps a, float32 and float64 take b): either zero is right there, nothing else is
        with np.errstate(invalid="ignore"):
            tie = (a == 0) & (b == 0) & (np.signbit(a) != np.signbit(b))
        assert (got[tie] == 0).all(), got[tie]
        got, want = got[~tie], want[~tie]
    _same_bits(got, want)


@pytest.mark.parametrize("dt", [d for d in SUPPORTED_DTYPES if is_float(d)], ids=lambda d: d.name)
@pytest.mark.parametrize("nranks", [1, 3, 8])
def test_scale_kernel_source_matches_numpy(lib, dt, nranks):
    buf = _samples(dt, np.random.default_rng(nranks))
    want = buf.copy()
    with np.errstate(all="ignore"):
        cpu.scale(ReduceOp.AVG, want, nranks)
    got = buf.view(storage_dtype(dt)).copy()
    scale = getattr(lib, "loop_" + function_names(ReduceOp.SUM, dt)[1])
    scale(ctypes.c_double(nranks), got.ctypes.data_as(ctypes.c_void_p), ctypes.c_long(got.size))
    _same_bits(got.view(dt), want)


def test_every_dtype_has_a_storage_type_cupy_knows():
    assert storage_dtype(BF16) == np.uint16
    assert storage_dtype(ml_dtypes.bfloat16).itemsize == 2
    for dt in SUPPORTED_DTYPES:
        assert storage_dtype(dt).itemsize == dt.itemsize
        assert storage_dtype(dt) != BF16


def test_function_names_are_unique_per_op_and_dtype():
    names = {n for dt in SUPPORTED_DTYPES for op in COMBINES for n in function_names(op, dt)}
    assert len(names) == 2 * len(SUPPORTED_DTYPES) * len(COMBINES)
