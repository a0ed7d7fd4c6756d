"""The one CUDA kernel of a GPU collective on the CUDA-IPC path: a *piece* (``gpu/plans.py``'s ``Step``).

One launch per piece, on the caller's stream. Every rank's scratch allocation
starts with a header that its peers map through CUDA IPC::

    [0, 256)        flag words, one per block: the last op (epoch) the block has published;
                    they only count up, so no op ever resets them (CUDA-graph replays stay correct)
    [256, 272)      the op's fingerprint, one per data half (the half is the epoch's parity)
    [4096, ...)     two data halves: consecutive ops alternate, so a rank that is one op ahead
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

The source is plain CUDA without headers: ``tests/test_gpu_piece_kernel.py`` compiles
every variant with NVRTC for sm_90 on a machine without a GPU.
"""

from __future__ import annotations

import re

import numpy as np

from ..dtypes import ReduceOp
from .gpu import BF16_CONVERT, C_TYPES, COMBINES, HALF_CONVERT, combine_op, device_functions, function_names

HEADER_BYTES = 4096
FLAG_WORDS = 64  # at most this many blocks in a spin-form launch
FP_OFFSET = 256
PUBLISH, SYNC, CONSUME = 1, 2, 4
ERR_TIMEOUT, ERR_MISMATCH, ERR_ABORT = 1, 2, 3
THREADS = 512
UNROLL = 4  # 16-byte units per thread in flight: enough loads outstanding to keep HBM busy

DTYPES = tuple(C_TYPES)

PRELUDE = HALF_CONVERT + BF16_CONVERT + f"#define UNROLL {UNROLL}\n" + r"""
typedef unsigned int u32;
typedef unsigned long long u64;
__device__ __forceinline__ u32 aioccl_ld_acquire(const u32* p) {
    u32 v; asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v;
}
__device__ __forceinline__ void aioccl_st_release(u32* p, u32 v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ u64 aioccl_now_ns() {
    u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}
// 16 bytes of T: the unit a thread moves; read or written element by element where the buffer is misaligned
template <typename T> union aioccl_vec { static constexpr int N = 16 / sizeof(T); uint4 q; T e[N]; };
template <typename T> __device__ __forceinline__ bool aioccl_aligned(const T* p) { return ((u64)p & 15u) == 0; }
template <typename T> __device__ __forceinline__ aioccl_vec<T> aioccl_load(const T* p, long long u, bool al) {
    aioccl_vec<T> v;
    if (al) { v.q = ((const uint4*)p)[u]; return v; }
#pragma unroll
    for (int w = 0; w < aioccl_vec<T>::N; w++) v.e[w] = p[u * aioccl_vec<T>::N + w];
    return v;
}
template <typename T> __device__ __forceinline__ void aioccl_store(T* p, long long u, const aioccl_vec<T>& v, bool al) {
    if (al) { ((uint4*)p)[u] = v.q; return; }
#pragma unroll
    for (int w = 0; w < aioccl_vec<T>::N; w++) p[u * aioccl_vec<T>::N + w] = v.e[w];
}
// this thread's units of a copy: u = first, first + step, ..., UNROLL of them loaded before any is stored
template <typename T> __device__ __forceinline__ void aioccl_copy(const T* src, T* dst, long long units,
                                                                  long long first, long long step, bool al) {
    for (long long u0 = first; u0 < units; u0 += UNROLL * step) {
        aioccl_vec<T> v[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; k++) if (u0 + k * step < units) v[k] = aioccl_load(src, u0 + k * step, al);
#pragma unroll
        for (int k = 0; k < UNROLL; k++) if (u0 + k * step < units) aioccl_store(dst, u0 + k * step, v[k], al);
    }
}
__device__ __forceinline__ void aioccl_fail(volatile u32* err, u32 code, u32 peer, u32 epoch, u32 kind) {
    if (err[0] == 0) { err[1] = peer; err[2] = epoch; err[3] = kind; __threadfence_system(); err[0] = code; }
    __threadfence_system();
}
"""

# The body, shared by every (operator, dtype): T, NAME, COMBINE(x, y) and SCALE(c, d) are defined before it.
# Data moves in 16-byte units (``aioccl_vec``), UNROLL units per thread in flight; a thread's units are the same
# in the publish and the consume loops on every rank (they depend on n and the grid only, never on a buffer's
# alignment), because in the spin form block b consumes exactly what block b of every peer published. A
# misaligned user buffer is read or written element by element within its unit; the last n % VEC elements of a
# piece go one per thread.
_BODY = r"""
extern "C" __global__ void __launch_bounds__(512) NAME(
        const u64* bases, const T* in, T* out, volatile u32* err,
        long long count, long long a, long long n, long long half_bytes, long long timeout_ns,
        u64 fp, double divisor, int rank, int nranks, int pub_blocks, int out_blocks, int nred,
        int src_root, int slot_block, int phase, u32 epoch_host, int kind) {
    typedef aioccl_vec<T> V;
    const int W = V::N;
    __shared__ int give_up;
    const int b = blockIdx.x, tid = threadIdx.x;
    u32* own_flags = (u32*)bases[rank];
    const u32 e = epoch_host ? epoch_host : ((volatile u32*)own_flags)[b] + 1u;
    const long long half = HEADER + (long long)(e & 1u) * half_bytes;
    const long long step = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)b * blockDim.x + tid;
    const long long units = n / W, rest = units * W;
    if (tid == 0) give_up = 0;
    if (phase & 1) {
        T* mine = (T*)(bases[rank] + half);
        for (int j = 0; j < pub_blocks; j++) {
            const T* src = in + j * count + a;
            T* dst = mine + j * n;
            const bool al = aioccl_aligned(src) && aioccl_aligned(dst);
            aioccl_copy(src, dst, units, first, step, al);
            for (long long i = rest + first; i < n; i += step) dst[i] = src[i];
        }
        if (tid == 0) ((volatile u64*)(bases[rank] + FPOFF))[e & 1u] = fp;
    }
    if (phase & 2) {
        __syncthreads();
        if (tid == 0) { __threadfence_system(); aioccl_st_release(own_flags + b, e); }
        if (tid < nranks && tid != rank) {
            const u32* theirs = (const u32*)bases[tid] + b;
            const u64 t0 = aioccl_now_ns();
            unsigned spins = 0;
            while ((int)(aioccl_ld_acquire(theirs) - e) < 0) {
                if ((++spins & 255u) == 0u) {
                    if (err[0] != 0) { give_up = 1; break; }
                    if ((long long)(aioccl_now_ns() - t0) > timeout_ns) {
                        aioccl_fail(err, TIMEOUT, (u32)tid, e, (u32)kind); give_up = 1; break;
                    }
                }
            }
        }
    }
    if (phase & 4) {
        __syncthreads();
        if (tid < nranks && ((volatile u64*)(bases[tid] + FPOFF))[e & 1u] != fp) {
            aioccl_fail(err, MISMATCH, (u32)tid, e, (u32)kind); give_up = 1;
        }
        __syncthreads();
        if (give_up) return;
        if (nred > 0) {
            T* dst = out + a;
            const bool al = aioccl_aligned(dst) && aioccl_aligned((const T*)(bases[0] + half) + slot_block * n);
            for (long long u0 = first; u0 < units; u0 += UNROLL * step) {
                V acc[UNROLL];
                const T* src0 = (const T*)(bases[0] + half) + slot_block * n;
#pragma unroll
                for (int k = 0; k < UNROLL; k++)
                    if (u0 + k * step < units) acc[k] = aioccl_load(src0, u0 + k * step, al);
                for (int r = 1; r < nred; r++) {
                    const T* src = (const T*)(bases[r] + half) + slot_block * n;
                    V x[UNROLL];
#pragma unroll
                    for (int k = 0; k < UNROLL; k++)
                        if (u0 + k * step < units) x[k] = aioccl_load(src, u0 + k * step, al);
#pragma unroll
                    for (int k = 0; k < UNROLL; k++)
#pragma unroll
                        for (int w = 0; w < W; w++) acc[k].e[w] = COMBINE(acc[k].e[w], x[k].e[w]);
                }
#pragma unroll
                for (int k = 0; k < UNROLL; k++) {
                    if (u0 + k * step >= units) continue;
                    if (divisor != 0.0) {
#pragma unroll
                        for (int w = 0; w < W; w++) acc[k].e[w] = SCALE(acc[k].e[w], divisor);
                    }
                    aioccl_store(dst, u0 + k * step, acc[k], al);
                }
            }
            for (long long i = rest + first; i < n; i += step) {
                T acc = ((const T*)(bases[0] + half))[slot_block * n + i];
                for (int r = 1; r < nred; r++) acc = COMBINE(acc, ((const T*)(bases[r] + half))[slot_block * n + i]);
                if (divisor != 0.0) acc = SCALE(acc, divisor);
                dst[i] = acc;
            }
        } else {
            for (int k2 = 0; k2 < out_blocks; k2++) {
                const T* src = (const T*)(bases[out_blocks > 1 ? k2 : src_root] + half) + slot_block * n;
                T* dst = out + k2 * count + a;
                const bool al = aioccl_aligned(src) && aioccl_aligned(dst);
                aioccl_copy(src, dst, units, first, step, al);
                for (long long i = rest + first; i < n; i += step) dst[i] = src[i];
            }
        }
    }
}
"""


_PLACEHOLDER = re.compile(r"\b(NAME|COMBINE|SCALE|HEADER|FPOFF|TIMEOUT|MISMATCH|T)\b")


def kernel_name(op: ReduceOp | None, dt: np.dtype) -> str:
    """The kernel for operator ``op`` (None: an op that only moves data) on logical dtype ``dt``."""
    return f"aioccl_piece_{combine_op(op).value}_{np.dtype(dt).name}"


def dtype_source(dt: np.dtype) -> str:
    """The four kernels (sum, prod, min, max) of one dtype, after ``PRELUDE``: one module per dtype."""
    ctype = C_TYPES[np.dtype(dt)][0]
    parts = []
    for op in COMBINES:
        comb, scale = function_names(op, dt)
        subs = {"NAME": kernel_name(op, dt), "COMBINE": comb, "SCALE": scale,
                "HEADER": str(HEADER_BYTES), "FPOFF": str(FP_OFFSET), "TIMEOUT": str(ERR_TIMEOUT),
                "MISMATCH": str(ERR_MISMATCH), "T": ctype}
        body = _PLACEHOLDER.sub(lambda m, s=subs: s[m.group(1)], _BODY)  # type: ignore[misc]
        parts.append(device_functions(op, dt) + body)
    return "\n".join(parts)


def module_source(dt: np.dtype) -> str:
    """What ``cupy.RawModule`` compiles for dtype ``dt``."""
    return PRELUDE + dtype_source(dt)


def all_source() -> str:
    """Every variant in one translation unit (the compile check)."""
    return PRELUDE + "\n".join(dtype_source(dt) for dt in DTYPES)
