// The small all_reduce in one block and one launch (kernels/gpu_piece.py owns it; gpu/piece.py's emulate_small
// is its meaning in numpy). Compiled after gpu_piece.cuh under the same T, NAME, COMBINE and SCALE, and taking
// the piece kernel's parameters, so a launch packs, runs through the lane and is reported like a piece's
// (of them it reads bases, in, out, err, a, n, timeout_ns, fp, divisor, rank, nranks, epoch_host, kind).
//
// NCCL's LL protocol, written our own way: a 16-byte line holds 8 bytes of data and the op's epoch twice, and
// is written with one 16-byte store, so a reader that sees the epoch in both words sees the data with it: no
// fence, no separate flag. Each rank writes its input as lines into its own LL half (the epoch's parity picks
// it: a rank one op ahead never overwrites lines a peer still reads, as with the data halves), line 0 holding
// the op's fingerprint. Thread l then waits for line l of every rank, in rank order, combines the data and,
// once every thread of the block has all of its lines and no fingerprint differed, writes the result: a
// failure (deadline, abort, mismatch) leaves the output untouched, as the piece kernel does.
//
// The epoch is the piece kernel's: this rank's flag word 0 plus one. One thread (the last) also publishes it
// in every flag word, after the fingerprint slot, for the next piece kernel to count on from and for the
// host's report of who is behind; a peer that ran a piece kernel at this epoch instead finds the mismatch there.
extern "C" __global__ void __launch_bounds__(512) NAME(
        const u64* bases, const T* in, T* out, volatile u32* err,
        long long count, long long a, long long n, long long half_bytes, long long timeout_ns,
        u64 fp, double divisor, int rank, int nranks, int pub_blocks, int out_blocks, int nred,
        int src_root, int slot_block, int phase, u32 epoch_host, int kind) {
    const int E = 8 / (int)sizeof(T);  // elements per line
    union line_data { u64 u; T e[8 / sizeof(T)]; };
    __shared__ volatile int give_up;  // (read while others may set it: advisory until the __syncthreads)
    const int tid = threadIdx.x;
    u32* own_flags = (u32*)bases[rank];
    const u32 e = epoch_host ? epoch_host : ((volatile u32*)own_flags)[0] + 1u;
    const long long half = PIECE_LL_OFFSET + (long long)(e & 1u) * PIECE_LL_HALF_BYTES;
    const int lines = 1 + (int)((n + E - 1) / E);
    if (tid == 0) give_up = 0;
    __syncthreads();
    line_data d;
    d.u = 0;
    if (tid < lines) {
        if (tid == 0) {
            d.u = fp;
        } else {
            const long long first = (long long)(tid - 1) * E;
#pragma unroll
            for (int w = 0; w < 8 / (int)sizeof(T); w++)
                if (first + w < n) d.e[w] = in[a + first + w];
        }
        aioccl_st_line((uint4*)(bases[rank] + half) + tid, d.u, e);
    }
    if (tid == blockDim.x - 1) {
        ((volatile u64*)(bases[rank] + PIECE_FP_OFFSET))[e & 1u] = fp;
        for (int w = 0; w < PIECE_FLAG_WORDS; w++) aioccl_st_release(own_flags + w, e);
    }
    line_data acc;
    acc.u = 0;
    if (tid < lines) {
        for (int r = 0; r < nranks && !give_up; r++) {
            const uint4* theirs = (const uint4*)(bases[r] + half) + tid;
            const u64 t0 = aioccl_now_ns();
            unsigned spins = 0;
            u64 got;
            while (!aioccl_ld_line(theirs, e, &got)) {
                if ((++spins & 255u) == 0u) {
                    if (err[0] != 0) { give_up = 1; break; }
                    // a peer that ran a piece kernel at this epoch writes no lines: its flag and fingerprint say so
                    if (tid == 0 && (int)(aioccl_ld_acquire((const u32*)bases[r]) - e) >= 0 &&
                        ((volatile u64*)(bases[r] + PIECE_FP_OFFSET))[e & 1u] != fp) {
                        aioccl_fail(err, PIECE_ERR_MISMATCH, (u32)r, e, (u32)kind); give_up = 1; break;
                    }
                    if ((long long)(aioccl_now_ns() - t0) > timeout_ns) {
                        aioccl_fail(err, PIECE_ERR_TIMEOUT, (u32)r, e, (u32)kind); give_up = 1; break;
                    }
                }
            }
            if (give_up) break;
            if (tid == 0) {
                if (got != fp) { aioccl_fail(err, PIECE_ERR_MISMATCH, (u32)r, e, (u32)kind); give_up = 1; }
                continue;
            }
            line_data x;
            x.u = got;
            if (r == 0) {
                acc = x;
            } else {
#pragma unroll
                for (int w = 0; w < 8 / (int)sizeof(T); w++) acc.e[w] = COMBINE(acc.e[w], x.e[w]);
            }
        }
    }
    __syncthreads();
    if (give_up || tid == 0 || tid >= lines) return;
    const long long first = (long long)(tid - 1) * E;
#pragma unroll
    for (int w = 0; w < 8 / (int)sizeof(T); w++) {
        if (first + w >= n) break;
        out[a + first + w] = divisor != 0.0 ? SCALE(acc.e[w], divisor) : acc.e[w];
    }
}
