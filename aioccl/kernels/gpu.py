"""GPU reduction arithmetic per (operator, dtype): CUDA device functions as source strings, the one table of it.

``device_functions(op, dt)`` is what the piece kernel (``gpu_piece.py``)
combines and averages with; ``storage_dtype`` is how a GPU buffer of each
dtype is stored (cupy has no bfloat16). Every function computes exactly as
the CPU path does (numpy ufuncs, ``ml_dtypes``), so GPU and CPU results are
bit-identical:

* float16 and bfloat16 compute in float and round once (round to nearest
  even), like numpy's half and ml_dtypes' bfloat16 loops;
* integers wrap: signed values are added and multiplied as unsigned of the
  same width (signed overflow is undefined in C, wrapping is what numpy does);
* min/max propagate NaN, like ``np.minimum`` / ``np.maximum``.

The functions and ``BF16_CONVERT`` are valid C too: ``tests/test_gpu_kernels.py``
compiles them with gcc and checks every (op, dtype) against numpy bit for bit.
Only the float16 conversions (``HALF_CONVERT``) are PTX; there the test
supplies C's own ``_Float16`` conversions, which round the same way.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ..dtypes import ReduceOp

BF16 = np.dtype(ml_dtypes.bfloat16)

# logical dtype -> (storage C type, how to compute, unsigned twin for wrapping)
C_TYPES: dict[np.dtype, tuple[str, str, str]] = {
    np.dtype(np.int8): ("signed char", "wrap", "unsigned char"),
    np.dtype(np.uint8): ("unsigned char", "native", ""),
    np.dtype(np.int32): ("int", "wrap", "unsigned int"),
    np.dtype(np.uint32): ("unsigned int", "native", ""),
    np.dtype(np.int64): ("long long", "wrap", "unsigned long long"),
    np.dtype(np.uint64): ("unsigned long long", "native", ""),
    np.dtype(np.float16): ("unsigned short", "half", ""),
    BF16: ("unsigned short", "bf16", ""),
    np.dtype(np.float32): ("float", "native", ""),
    np.dtype(np.float64): ("double", "native", ""),
}

# x, y: the operands in the compute type
EXPR = {
    ReduceOp.SUM: "x + y",
    ReduceOp.PROD: "x * y",
    # x != x: x is NaN, which wins as in np.minimum; on a tie (+0 vs -0) y wins, as in numpy and x86's minps
    ReduceOp.MIN: "(x != x || x < y) ? x : y",
    ReduceOp.MAX: "(x != x || x > y) ? x : y",
}
COMBINES = tuple(EXPR)  # avg: summed like sum, divided once at the end

HALF_CONVERT = r"""
__device__ __forceinline__ float aioccl_h2f(unsigned short h) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ unsigned short aioccl_f2h(float f) {
    unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
"""

# bfloat16 <-> float, as ml_dtypes does it (round to nearest even, NaN stays a quiet NaN). Valid C and CUDA.
BF16_CONVERT = r"""
__device__ __forceinline__ float aioccl_b2f(unsigned short h) {
    union { unsigned int u; float f; } v; v.u = ((unsigned int)h) << 16; return v.f;
}
__device__ __forceinline__ unsigned short aioccl_f2b(float f) {
    union { unsigned int u; float f; } v; v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((v.u >> 16) | 0x40u);
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (unsigned short)(v.u >> 16);
}
"""


def storage_dtype(dt: np.dtype) -> np.dtype:
    """The dtype a GPU buffer of logical dtype ``dt`` is stored as in cupy (bfloat16 -> uint16)."""
    dt = np.dtype(dt)
    return np.dtype(np.uint16) if dt == BF16 else dt


def combine_op(op: ReduceOp | None) -> ReduceOp:
    """The combine an op reduces with (avg sums; an op that only moves data uses sum's, never called)."""
    return ReduceOp.SUM if op in (None, ReduceOp.AVG) else op


def function_names(op: ReduceOp, dt: np.dtype) -> tuple[str, str]:
    """(combine, scale) device function names for a combine ``op`` (one of ``COMBINES``) on ``dt``."""
    tag = f"{op.value}_{np.dtype(dt).name}"
    return f"aioccl_comb_{tag}", f"aioccl_scale_{tag}"


def device_functions(op: ReduceOp, dt: np.dtype) -> str:
    """``T comb(T a, T b)`` and ``T scale(T c, double d)`` (finishing an average) on the storage type."""
    ctype, how, wrap = C_TYPES[np.dtype(dt)]
    expr = EXPR[op]
    if how in ("half", "bf16"):
        to, back = ("aioccl_h2f", "aioccl_f2h") if how == "half" else ("aioccl_b2f", "aioccl_f2b")
        comb = f"float x = {to}(a), y = {to}(b); return {back}({expr});"
        scale = f"return {back}({to}(c) / (float)d);"
    elif how == "wrap" and op in (ReduceOp.SUM, ReduceOp.PROD):  # signed overflow wraps, as in numpy
        comb = f"{wrap} x = ({wrap})a, y = ({wrap})b; return ({ctype})({wrap})({expr});"
        scale = "return c;"
    else:
        comb = f"{ctype} x = a, y = b; return ({ctype})({expr});"
        scale = {"float": "return c / (float)d;", "double": "return c / d;"}.get(ctype, "return c;")
    comb_name, scale_name = function_names(op, dt)
    return (f"__device__ __forceinline__ {ctype} {comb_name}({ctype} a, {ctype} b) {{ {comb} }}\n"
            f"__device__ __forceinline__ {ctype} {scale_name}({ctype} c, double d) {{ {scale} }}\n")
