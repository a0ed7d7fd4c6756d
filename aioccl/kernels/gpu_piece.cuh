// What every piece kernel uses (gpu_piece.cu, gpu_small.cu): acquire and release flags, the clock, 16-byte units of data
// moved UNROLL at a time per thread, and the error word. Compiled once per module, before the kernels;
// kernels/gpu_piece.py puts before it the scratch layout's constants (PIECE_HEADER_BYTES, PIECE_FP_OFFSET,
// PIECE_ERR_*, UNROLL) and the float16/bfloat16 conversions of kernels/gpu.py.
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
// an LL line (gpu_small.cu): 8 bytes of data and the epoch twice, written with one 16-byte store, so a reader
// that sees the epoch in both words sees the data written with it
__device__ __forceinline__ void aioccl_st_line(uint4* p, u64 data, u32 e) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};"
                 :: "l"(p), "r"((u32)data), "r"(e), "r"((u32)(data >> 32)), "r"(e) : "memory");
}
// true, and the line's data in *data, once it holds epoch e
__device__ __forceinline__ bool aioccl_ld_line(const uint4* p, u32 e, u64* data) {
    u32 d0, f0, d1, f1;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(d0), "=r"(f0), "=r"(d1), "=r"(f1) : "l"(p) : "memory");
    *data = ((u64)d1 << 32) | d0;
    return f0 == e && f1 == e;
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
