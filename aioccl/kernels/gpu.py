"""GPU reduction arithmetic per (operator, dtype) as CUDA source strings: the one table of it.

``EXPR`` is what the device kernel (``gpu_piece.py``) combines with; the
operation strings below (``combine_spec``, ``scale_spec``) are the same
arithmetic as C, which ``tests/test_gpu_kernels.py`` compiles with gcc and
checks against numpy element by element, without a GPU.

Every kernel computes ``c = op(a, b)`` the way the CPU path (numpy ufuncs,
``ml_dtypes``) does, so GPU and CPU results are bit-identical:

* float16 and bfloat16 compute in float and round once (round to nearest
  even), like numpy's half and ml_dtypes' bfloat16 loops;
* integers wrap: signed values are added and multiplied as unsigned of the
  same width (signed overflow is undefined in C, wrapping is what numpy does);
* min/max propagate NaN, like ``np.minimum`` / ``np.maximum``.

cupy has no bfloat16, so bfloat16 buffers travel as uint16 storage and the
kernels convert explicitly (the preamble below).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from ..dtypes import ReduceOp

BF16 = np.dtype(ml_dtypes.bfloat16)

# logical dtype -> (type name in ElementwiseKernel params, storage dtype, how to compute)
#   compute "float": widen to float, round back; "unsigned": wrap through this unsigned C type; "native": as is
_TYPES: dict[np.dtype, tuple[str, np.dtype, str, str]] = {
    np.dtype(np.int8): ("int8", np.dtype(np.int8), "unsigned", "unsigned char"),
    np.dtype(np.uint8): ("uint8", np.dtype(np.uint8), "native", ""),
    np.dtype(np.int32): ("int32", np.dtype(np.int32), "unsigned", "unsigned int"),
    np.dtype(np.uint32): ("uint32", np.dtype(np.uint32), "native", ""),
    np.dtype(np.int64): ("int64", np.dtype(np.int64), "unsigned", "unsigned long long"),
    np.dtype(np.uint64): ("uint64", np.dtype(np.uint64), "native", ""),
    np.dtype(np.float16): ("float16", np.dtype(np.float16), "float", "float16"),
    BF16: ("uint16", np.dtype(np.uint16), "bf16", ""),
    np.dtype(np.float32): ("float32", np.dtype(np.float32), "native", ""),
    np.dtype(np.float64): ("float64", np.dtype(np.float64), "native", ""),
}

# bfloat16 <-> float, as ml_dtypes does it (round to nearest even, NaN stays a quiet NaN). Valid C and CUDA.
PREAMBLE = """
__device__ float aioccl_bf16_to_f32(unsigned short h) {
    union { unsigned int u; float f; } v;
    v.u = ((unsigned int)h) << 16;
    return v.f;
}
__device__ unsigned short aioccl_f32_to_bf16(float f) {
    union { unsigned int u; float f; } v;
    v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((v.u >> 16) | 0x40u);
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (unsigned short)(v.u >> 16);
}
"""

# x, y: the operands in the compute type
EXPR = {
    ReduceOp.SUM: "x + y",
    ReduceOp.AVG: "x + y",  # summed like SUM, divided once at the end (see scale_spec)
    ReduceOp.PROD: "x * y",
    # x != x: x is NaN, which wins as in np.minimum; on a tie (+0 vs -0) y wins, as in numpy and x86's minps
    ReduceOp.MIN: "(x != x || x < y) ? x : y",
    ReduceOp.MAX: "(x != x || x > y) ? x : y",
}


@dataclass(frozen=True)
class KernelSpec:
    """The arguments of one ``cupy.ElementwiseKernel``."""

    name: str
    in_params: str
    out_params: str
    operation: str
    preamble: str


def storage_dtype(dt: np.dtype) -> np.dtype:
    """The dtype a GPU buffer of logical dtype ``dt`` is stored as in cupy (bfloat16 -> uint16)."""
    return _TYPES[np.dtype(dt)][1]


def combine_spec(op: ReduceOp, dt: np.dtype) -> KernelSpec:
    """``c = op(a, b)`` for logical dtype ``dt``."""
    tname, _, how, ctype = _TYPES[np.dtype(dt)]
    expr = EXPR[op]
    if how == "float":
        body = f"float x = (float)a; float y = (float)b; c = ({ctype})({expr});"
    elif how == "bf16":
        body = f"float x = aioccl_bf16_to_f32(a); float y = aioccl_bf16_to_f32(b); c = aioccl_f32_to_bf16({expr});"
    elif how == "unsigned":
        if op in (ReduceOp.MIN, ReduceOp.MAX):  # compare as signed; nothing can overflow
            body = f"{_signed_c(tname)} x = a; {_signed_c(tname)} y = b; c = {expr};"
        else:
            body = f"{ctype} x = ({ctype})a; {ctype} y = ({ctype})b; c = ({_signed_c(tname)})({ctype})({expr});"
    else:
        body = f"{_native_c(tname)} x = a; {_native_c(tname)} y = b; c = {expr};"
    return KernelSpec(f"aioccl_{op.value}_{np.dtype(dt).name}", f"{tname} a, {tname} b", f"{tname} c", body,
                      PREAMBLE if how == "bf16" else "")


def scale_spec(dt: np.dtype) -> KernelSpec:
    """``c = c / n`` (finishing an average), for float dtypes only (integer avg is refused up front)."""
    tname, _, how, ctype = _TYPES[np.dtype(dt)]
    if how == "float":
        body = f"c = ({ctype})((float)c / (float)n);"
    elif how == "bf16":
        body = "c = aioccl_f32_to_bf16(aioccl_bf16_to_f32(c) / (float)n);"
    elif tname in ("float32", "float64"):
        body = f"c = c / ({_native_c(tname)})n;"
    else:
        raise ValueError(f"avg is not defined for {np.dtype(dt).name}")
    return KernelSpec(f"aioccl_scale_{np.dtype(dt).name}", "float64 n", f"{tname} c", body,
                      PREAMBLE if how == "bf16" else "")


def _signed_c(tname: str) -> str:
    return {"int8": "signed char", "int32": "int", "int64": "long long"}[tname]


def _native_c(tname: str) -> str:
    return {"uint8": "unsigned char", "uint32": "unsigned int", "uint64": "unsigned long long",
            "float32": "float", "float64": "double"}[tname]
