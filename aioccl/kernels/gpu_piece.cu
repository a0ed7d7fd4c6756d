// The one CUDA kernel of a GPU collective on the CUDA-IPC path: a piece (gpu/plans.py's Step), one launch per
// piece on the caller's stream; what it does, and the scratch header's layout: kernels/gpu_piece.py, its
// owner, which compiles it with NVRTC (cupy.RawModule) once per (operator, dtype), after gpu_piece.cuh and
// with these defined: T (the storage type), NAME (the kernel's name, gpu_piece.kernel_name), COMBINE(x, y)
// and SCALE(c, d) (kernels/gpu.py's device functions for the operator).
//
// Data moves in 16-byte units (aioccl_vec), UNROLL units per thread in flight; a thread's units are the same
// in the publish and the consume loops on every rank (they depend on n and the grid only, never on a buffer's
// alignment), because in the spin form block b consumes exactly what block b of every peer published. A
// misaligned user buffer is read or written element by element within its unit; the last n % VEC elements of a
// piece go one per thread.
//
// Plain CUDA without headers: tests/test_gpu_piece.py compiles every variant for sm_90 without a GPU.
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
    const long long half = PIECE_HEADER_BYTES + (long long)(e & 1u) * half_bytes;
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
        if (tid == 0) ((volatile u64*)(bases[rank] + PIECE_FP_OFFSET))[e & 1u] = fp;
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
                        aioccl_fail(err, PIECE_ERR_TIMEOUT, (u32)tid, e, (u32)kind); give_up = 1; break;
                    }
                }
            }
        }
    }
    if (phase & 4) {
        __syncthreads();
        if (tid < nranks && ((volatile u64*)(bases[tid] + PIECE_FP_OFFSET))[e & 1u] != fp) {
            aioccl_fail(err, PIECE_ERR_MISMATCH, (u32)tid, e, (u32)kind); give_up = 1;
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
