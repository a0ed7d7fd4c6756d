"""The one CUDA kernel of a GPU collective on the CUDA-IPC path: a *piece* (``gpu/plans.py``'s ``Step``).

One launch per piece, on the caller's stream. Every rank's scratch allocation
starts with a header that its peers map through CUDA IPC::

    [0, 256)        flag words, one per block: the last op (epoch) the block has published;
                    they only count up, so no op ever resets them (CUDA-graph replays stay correct)
    [256, 272)      the op's fingerprint, one per data half (the half is the epoch's parity)
    [4096, 20480)   two halves of LL lines for the small all_reduce (``gpu_small.cu``)
    [20480, ...)    two data halves: consecutive ops alternate, so a rank that is one op ahead
                    never overwrites what a peer still reads (no closing barrier needed)

``phase`` says what the launch does, so the two synchronisation forms share one kernel:

* ``PUBLISH | SYNC | CONSUME`` (*spin* form, ranks whose kernels run at once: MPS, or one
  process per GPU): copy in, publish the flag with a release store, spin on the peers'
  flags (acquire) with a deadline, check the fingerprints, reduce or fetch;
* ``PUBLISH`` then ``CONSUME`` (*stream* form, processes time-sliced on one GPU): the host
  puts ``cuStreamWriteValue32`` / ``cuStreamWaitValue32`` on the flags between the two
  launches, so nothing spins across processes.

A block gives up after ``timeout_ns`` (``%globaltimer``) or when the host sets the error
word (``ERR_ABORT``); it then writes what failed into ``err`` (host-mapped memory the
engine polls) and leaves the output untouched. Reductions run in rank order, the
combine being ``kernels/gpu.py``'s operation, so every rank's result is bit-identical.

An all_reduce of at most ``SMALL_MAX_BYTES`` may instead run ``gpu_small.cu``: one block, one launch, the
data and the epoch in one 16-byte line (NCCL's LL protocol, our own code), in the spin form only, when
``AIOCCL_GPU_SMALL_BYTES`` asks for it (``gpu/device_path.py``).

The kernel is CUDA source, ``gpu_piece.cu`` (what every kernel uses: ``gpu_piece.cuh``), plain CUDA without
headers: ``tests/test_gpu_piece.py`` compiles every variant with NVRTC for sm_90 on a machine without a
GPU. This module is its owner: the layout's constants it is compiled with, and one kernel per (operator,
dtype).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..dtypes import ReduceOp
from .gpu import BF16_CONVERT, C_TYPES, COMBINES, HALF_CONVERT, combine_op, device_functions, function_names

FLAG_WORDS = 64  # at most this many blocks in a spin-form launch
FP_OFFSET = 256
# the small all_reduce's LL lines (gpu_small.cu): one 16-byte line per thread of one block, line 0 the fingerprint
LL_OFFSET = 4096
LL_LINE_BYTES = 16
LL_HALF_BYTES = 512 * LL_LINE_BYTES
SMALL_MAX_BYTES = (512 - 1) * 8  # the most a small all_reduce carries: 8 bytes of data per line after line 0
HEADER_BYTES = LL_OFFSET + 2 * LL_HALF_BYTES
PUBLISH, SYNC, CONSUME = 1, 2, 4
ERR_TIMEOUT, ERR_MISMATCH, ERR_ABORT = 1, 2, 3
THREADS = 512
UNROLL = 4  # 16-byte units per thread in flight: enough loads outstanding to keep HBM busy

DTYPES = tuple(C_TYPES)

# the kernel's CUDA source, beside this file: what every kernel uses, and the kernel itself
COMMON_FILE = Path(__file__).with_name("gpu_piece.cuh")
KERNEL_FILE = Path(__file__).with_name("gpu_piece.cu")
SMALL_FILE = Path(__file__).with_name("gpu_small.cu")
_MACROS = ("T", "NAME", "COMBINE", "SCALE")


def _prelude() -> str:
    """What each module starts with: the scratch layout's constants (from here, never copied into the CUDA
    files), the float16/bfloat16 conversions, and what every kernel uses."""
    defines = {"PIECE_HEADER_BYTES": HEADER_BYTES, "PIECE_FP_OFFSET": FP_OFFSET, "PIECE_ERR_TIMEOUT": ERR_TIMEOUT,
               "PIECE_ERR_MISMATCH": ERR_MISMATCH, "UNROLL": UNROLL, "PIECE_FLAG_WORDS": FLAG_WORDS,
               "PIECE_LL_OFFSET": LL_OFFSET, "PIECE_LL_HALF_BYTES": LL_HALF_BYTES}
    return ("".join(f"#define {k} {v}\n" for k, v in defines.items()) + HALF_CONVERT + BF16_CONVERT
            + COMMON_FILE.read_text())


def kernel_name(op: ReduceOp | None, dt: np.dtype) -> str:
    """The kernel for operator ``op`` (None: an op that only moves data) on logical dtype ``dt``."""
    return f"aioccl_piece_{combine_op(op).value}_{np.dtype(dt).name}"


def small_kernel_name(op: ReduceOp | None, dt: np.dtype) -> str:
    """The small all_reduce's kernel (``gpu_small.cu``) for operator ``op`` on logical dtype ``dt``."""
    return f"aioccl_small_{combine_op(op).value}_{np.dtype(dt).name}"


def dtype_source(dt: np.dtype) -> str:
    """The four kernels (sum, prod, min, max) of one dtype, after ``_prelude``: one module per dtype. The
    kernel file once per operator, under its own T, NAME, COMBINE and SCALE."""
    ctype = C_TYPES[np.dtype(dt)][0]
    kernel, small = KERNEL_FILE.read_text(), SMALL_FILE.read_text()
    parts = []
    for op in COMBINES:
        comb, scale = function_names(op, dt)
        for name, source in ((kernel_name(op, dt), kernel), (small_kernel_name(op, dt), small)):
            values = dict(zip(_MACROS, (ctype, name, comb, scale), strict=True))
            parts.append("".join(f"#define {k} {v}\n" for k, v in values.items()) + source
                         + "".join(f"#undef {k}\n" for k in _MACROS))
        parts[-2] = device_functions(op, dt) + parts[-2]
    return "\n".join(parts)


def module_source(dt: np.dtype) -> str:
    """What ``cupy.RawModule`` compiles for dtype ``dt``."""
    return _prelude() + dtype_source(dt)


def all_source() -> str:
    """Every variant in one translation unit (the compile check)."""
    return _prelude() + "\n".join(dtype_source(dt) for dt in DTYPES)
