/* The lockstep protocol (see channel.h): stage, publish, wait, read, resumable at every wait. */
#define _GNU_SOURCE
#include "channel.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cma.h"
#include "jitter.h"
#include "reduce.h"

static inline int64_t *ctl(const ac_chan *ch, int j) { return (int64_t *)(void *)ch->seg[j]; }

static inline int64_t load_acq(const int64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int64_t ac_step(const ac_chan *ch) { return load_acq(&ctl(ch, ch->rank)[AC_W_CTR]); }

int ac_chan_init(ac_chan *ch, int rank, int size, uint8_t *const *segs, const size_t *lens,
                 int64_t spin_ns, int yield_cpu) {
    memset(ch, 0, sizeof *ch);
    if (size < 1 || size > AC_MAX_RANKS || rank < 0 || rank >= size) {
        snprintf(ch->error, sizeof ch->error, "rank %d of %d ranks (at most %d)", rank, size, AC_MAX_RANKS);
        return -1;
    }
    ch->rank = rank;
    ch->size = size;
    ch->spin_ns = spin_ns < 0 ? 0 : spin_ns;
    ch->yield_cpu = yield_cpu;
    for (int j = 0; j < size; j++) {
        if (segs[j] == NULL || lens[j] < AC_CONTROL_BYTES || ((uintptr_t)segs[j] & 7u)) {
            snprintf(ch->error, sizeof ch->error, "rank %d's segment is not a mapped control page", j);
            return -1;
        }
        ch->seg[j] = segs[j];
        ch->seg_len[j] = lens[j];
        /* a peer's slot size is its word: it must fit the mapping this process has of it */
        int64_t half = load_acq(&ctl(ch, j)[AC_W_HALF]);
        if (half <= 0 || (uint64_t)half > (lens[j] - AC_CONTROL_BYTES) / 2) {
            snprintf(ch->error, sizeof ch->error, "rank %d's segment says slot halves of %lld bytes, "
                     "but %zu bytes are mapped", j, (long long)half, lens[j]);
            return -1;
        }
        ch->half[j] = (size_t)half;
        ch->slot[j][0] = AC_CONTROL_BYTES;
        ch->slot[j][1] = AC_CONTROL_BYTES + (size_t)half;
    }
    int64_t hoff = ctl(ch, rank)[AC_W_HEAP_OFF], hlen = ctl(ch, rank)[AC_W_HEAP];
    if (hoff >= 0 && hlen >= 0 && (uint64_t)hoff <= lens[rank] && (uint64_t)hlen <= lens[rank] - (size_t)hoff) {
        ch->heap_off = (size_t)hoff;
        ch->heap_len = (size_t)hlen;
    }
    return 0;
}

int ac_chan_cma(ac_chan *ch, size_t min_bytes) {
    for (int j = 0; j < ch->size; j++) {
        int64_t pid = load_acq(&ctl(ch, j)[AC_W_PID]);
        if (pid <= 0 || pid > INT32_MAX) {
            snprintf(ch->error, sizeof ch->error, "rank %d's segment names an impossible process (%lld)", j,
                     (long long)pid);
            return -1;
        }
        ch->pid[j] = (int32_t)pid;
    }
    ch->cma_min = min_bytes;
    return 0;
}

void ac_chan_slice(ac_chan *ch, int64_t slice_ns) { ch->slice_ns = slice_ns < 0 ? 0 : slice_ns; }

void ac_chan_free(ac_chan *ch) {
    free(ch->spill);
    ch->spill = NULL;
    ch->spill_len = 0;
    free(ch->cma_buf);
    ch->cma_buf = NULL;
    ch->cma_buf_len = 0;
    ch->active = 0;
}

void ac_reset(ac_chan *ch) { ch->active = 0; }

/* -- waiting ------------------------------------------------------------------------------------ */
static int reached(const ac_chan *ch, const int64_t *ranks, int64_t n, int64_t s) {
    for (int64_t k = 0; k < n; k++)
        if (load_acq(&ctl(ch, (int)ranks[k])[AC_W_CTR]) < s)
            return 0;
    return 1;
}

static int reached_all(const ac_chan *ch, int64_t s) {
    for (int j = 0; j < ch->size; j++)
        if (j != ch->rank && load_acq(&ctl(ch, j)[AC_W_CTR]) < s)
            return 0;
    return 1;
}

/* spin (yielding the CPU between looks when asked) until reached or the op's spin budget is spent */
static int spin(ac_chan *ch, const int64_t *ranks, int64_t n, int64_t s, int64_t until) {
    int all = ranks == NULL;
    ac_jitter();
    if (all ? reached_all(ch, s) : reached(ch, ranks, n, s))
        return 1;
    for (;;) {
        if (ch->yield_cpu)
            sched_yield();
        else
            __builtin_ia32_pause();
        if (all ? reached_all(ch, s) : reached(ch, ranks, n, s)) {
            ch->spin_hits++;
            return 1;
        }
        if (now_ns() >= until)
            return 0;
    }
}

static void publish(ac_chan *ch, int64_t s) {
    ac_jitter();
    __atomic_store_n(&ctl(ch, ch->rank)[AC_W_CTR], s, __ATOMIC_SEQ_CST);  /* a full fence on x86 */
    for (int j = 0; j < ch->size; j++)
        if (j != ch->rank && __atomic_load_n(&ctl(ch, j)[AC_W_SLEEP], __ATOMIC_SEQ_CST))
            ch->bells |= 1ULL << j;
}

/* -- reading ------------------------------------------------------------------------------------ */
static int corrupt(ac_chan *ch, int j, const char *what, long long v) {
    snprintf(ch->error, sizeof ch->error, "rank %d's shared memory holds an impossible %s (%lld): "
             "a corrupted or foreign peer", j, what, v);
    return -1;
}

/* rank j's region (in elements) for a read at slot half `half`: its slot, or its registered buffer
 * where its descriptor says so; NULL (with ch->error) when the descriptor points outside its mapping */
static const uint8_t *peer_region(ac_chan *ch, int j, int64_t buf, int64_t start, int64_t stop, int64_t slot,
                                  int half) {
    size_t bytes = (size_t)(stop - start) * ch->item;
    int64_t off = ch->descs[j][buf == AC_IN ? 4 : 5];
    if (off >= 0) {
        size_t at = (size_t)start * ch->item;
        if ((uint64_t)off > ch->seg_len[j] || at > ch->seg_len[j] - (size_t)off ||
            bytes > ch->seg_len[j] - (size_t)off - at) {
            corrupt(ch, j, "registered-buffer offset", off);
            return NULL;
        }
        return ch->seg[j] + off + at;
    }
    size_t at = (size_t)slot * ch->item;
    if (at > ch->half[j] || bytes > ch->half[j] - at) {
        snprintf(ch->error, sizeof ch->error, "a read of %zu bytes at %zu passes rank %d's slot of %zu bytes",
                 bytes, at, j, ch->half[j]);
        return NULL;
    }
    return ch->seg[j] + ch->slot[j][half] + at;
}

/* whether rank j lets peers read that buffer in place, and where the region lies in its process (*at:
 * unsigned arithmetic, so a hostile address wraps instead of overflowing; the kernel checks the range) */
static int peer_addr(const ac_chan *ch, int j, int64_t buf, int64_t start, uint64_t *at) {
    int64_t addr = ch->descs[j][buf == AC_IN ? 6 : 7];
    if (addr < 0)
        return 0;
    *at = (uint64_t)addr + (uint64_t)start * ch->item;
    return 1;
}

static int cma_failed(ac_chan *ch, int j, int err, size_t bytes) {
    snprintf(ch->error, sizeof ch->error, "reading %zu bytes of rank %d's buffer in place (process %d) failed: "
             "%s", bytes, j, (int)ch->pid[j], strerror(err));
    return -1;
}

/* a reduction whose sources include buffers read in place: piece by piece, each peer's piece copied
 * into my memory first (a piece stays in cache for the combine), in rank order as ever */
#define AC_CMA_PIECE (128u << 10)
static int reduce_in_place(ac_chan *ch, const int64_t *src, int64_t nsrc, uint8_t *acc, size_t n, int half) {
    const size_t item = ch->item, piece = AC_CMA_PIECE / item * item, bytes = n * item;
    const int me = ch->rank;
    size_t need = (size_t)nsrc * piece;
    if (ch->cma_buf_len < need) {
        uint8_t *p = realloc(ch->cma_buf, need);
        if (p == NULL) {
            snprintf(ch->error, sizeof ch->error, "out of memory for a %zu-byte reduction", bytes);
            return -1;
        }
        ch->cma_buf = p;
        ch->cma_buf_len = need;
    }
    for (size_t o = 0; o < bytes; o += piece) {
        size_t m = bytes - o < piece ? bytes - o : piece;
        const uint8_t *from[AC_MAX_RANKS];
        for (int64_t k = 0; k < nsrc; k++) {
            const int64_t *x = src + 5 * k;
            int j = (int)x[0];
            uint64_t addr;
            if (j == me) {
                from[k] = ch->buf[x[1]] + (size_t)x[2] * item + o;
            } else if (peer_addr(ch, j, x[1], x[2], &addr)) {
                uint8_t *to = ch->cma_buf + (size_t)k * piece;
                int err = ac_cma_read(ch->pid[j], to, addr + o, m);
                if (err)
                    return cma_failed(ch, j, err, m);
                ch->cma_reads++;
                from[k] = to;
            } else {
                const uint8_t *at = peer_region(ch, j, x[1], x[2], x[3], x[4], half);
                if (at == NULL)
                    return -1;
                from[k] = at + o;
            }
        }
        if (nsrc == 1) {
            if (acc + o != from[0])
                memmove(acc + o, from[0], m);
            continue;
        }
        if (ac_combine(ch->redop, ch->dtype, acc + o, from[0], from[1], m / item) != 0) {
            snprintf(ch->error, sizeof ch->error, "no reduction %d for dtype %d", ch->redop, ch->dtype);
            return -1;
        }
        for (int64_t k = 2; k < nsrc; k++)
            ac_combine(ch->redop, ch->dtype, acc + o, acc + o, from[k], m / item);
    }
    return 0;
}

static uint8_t *spill(ac_chan *ch, size_t bytes) {
    if (ch->spill_len < bytes) {
        uint8_t *p = realloc(ch->spill, bytes);
        if (p == NULL)
            return NULL;
        ch->spill = p;
        ch->spill_len = bytes;
    }
    return ch->spill;
}

static int overlap(const uint8_t *a, size_t an, const uint8_t *b, size_t bn) {
    return an && bn && a < b + bn && b < a + an;
}

/* A broadcast's root writes the back 1/size of each chunk into receiver j's output while j reads the
 * front: two cores copy what one would. Only where the root's buffer is offered in place and is also
 * its output (an in-place root copies nothing itself), and j's output is offered; root and receiver
 * decide alike, from the descriptors. The back part starts at split(): the same on both sides. */
static int root_writes(const ac_chan *ch, int j) {
    int64_t root = ch->prog[7];
    if (ch->prog[4] != AC_CODE_BROADCAST || root < 0 || root >= ch->size || j == root)
        return 0;
    const int64_t *r = ch->descs[root];
    return r[6] >= 0 && r[6] == r[7] && ch->descs[j][7] >= 0;
}

static int64_t split(const ac_chan *ch, int64_t start, int64_t stop) {
    return stop - (stop - start) / ch->size;
}

/* the root's part of the step's chunks (its stage regions: what its receivers fetch) */
static int write_back_parts(ac_chan *ch, const int64_t *stage, int64_t nstage) {
    const size_t item = ch->item;
    for (int64_t k = 0; k < nstage; k++) {
        const int64_t *st = stage + 4 * k;
        int64_t from = split(ch, st[1], st[2]);
        size_t bytes = (size_t)(st[2] - from) * item;
        if (st[0] != AC_IN || !bytes)
            continue;
        for (int j = 0; j < ch->size; j++) {
            if (!root_writes(ch, j))
                continue;
            uint64_t to = (uint64_t)ch->descs[j][7] + (uint64_t)from * item;
            int err = ac_cma_write(ch->pid[j], to, ch->buf[AC_IN] + (size_t)from * item, bytes);
            if (err) {
                snprintf(ch->error, sizeof ch->error, "writing %zu bytes into rank %d's buffer in place "
                         "(process %d) failed: %s", bytes, j, (int)ch->pid[j], strerror(err));
                return -1;
            }
            ch->cma_writes++;
        }
    }
    return 0;
}

/* a step's reads, from p (its first read) on; returns 0, or -1 (ch->error) */
static int do_reads(ac_chan *ch, const int64_t *p, int64_t nreads, int half) {
    const int me = ch->rank;
    const size_t item = ch->item;
    for (int64_t r = 0; r < nreads; r++) {
        int64_t kind = p[0], nsrc = p[1];
        const int64_t *src = p + 2, *dst = p + 2 + 5 * nsrc;
        p = dst + 3;
        size_t n = (size_t)(dst[2] - dst[1]), bytes = n * item;
        if (!n)
            continue;
        uint8_t *d = ch->buf[dst[0]] + (size_t)dst[1] * item;
        if (kind == 0) {
            const uint8_t *from;
            uint64_t addr;
            if (src[0] == me) {
                from = ch->buf[src[1]] + (size_t)src[2] * item;
                if (from == d)
                    continue;
                memmove(d, from, bytes);
            } else if (peer_addr(ch, (int)src[0], src[1], src[2], &addr)) {
                if (root_writes(ch, me))  /* the root writes the back part */
                    bytes = (size_t)(split(ch, src[2], src[3]) - src[2]) * item;
                int err = ac_cma_read(ch->pid[src[0]], d, addr, bytes);
                if (err)
                    return cma_failed(ch, (int)src[0], err, bytes);
                ch->cma_reads++;
            } else {
                from = peer_region(ch, (int)src[0], src[1], src[2], src[3], src[4], half);
                if (from == NULL)
                    return -1;
                memcpy(d, from, bytes);
            }
            continue;
        }
        const uint8_t *from[AC_MAX_RANKS];
        int must_spill = 0, in_place = 0;
        uint64_t addr;
        for (int64_t k = 0; k < nsrc; k++) {
            const int64_t *x = src + 5 * k;
            if (x[0] == me) {
                from[k] = ch->buf[x[1]] + (size_t)x[2] * item;
                /* my own input read after the first combine wrote the destination: reduce aside */
                if (overlap(from[k], bytes, d, bytes) && (k >= 2 || from[k] != d))
                    must_spill = 1;
            } else if (peer_addr(ch, (int)x[0], x[1], x[2], &addr)) {
                in_place = 1;
            } else if ((from[k] = peer_region(ch, (int)x[0], x[1], x[2], x[3], x[4], half)) == NULL) {
                return -1;
            }
        }
        uint8_t *acc = d;
        if (must_spill && (acc = spill(ch, bytes)) == NULL) {
            snprintf(ch->error, sizeof ch->error, "out of memory for a %zu-byte reduction", bytes);
            return -1;
        }
        if (in_place) {
            if (reduce_in_place(ch, src, nsrc, acc, n, half) != 0)
                return -1;
        } else if (nsrc == 1) {
            if (acc != from[0])
                memmove(acc, from[0], bytes);
        } else {
            if (ac_combine(ch->redop, ch->dtype, acc, from[0], from[1], n) != 0) {
                snprintf(ch->error, sizeof ch->error, "no reduction %d for dtype %d", ch->redop, ch->dtype);
                return -1;
            }
            for (int64_t k = 2; k < nsrc; k++)
                ac_combine(ch->redop, ch->dtype, acc, acc, from[k], n);
        }
        if (acc != d)
            memcpy(d, acc, bytes);
    }
    return 0;
}

/* -- one op ------------------------------------------------------------------------------------- */
static int64_t heap_offset(const ac_chan *ch, const uint8_t *p, size_t len) {
    const uint8_t *h = ch->seg[ch->rank] + ch->heap_off;
    if (!len || !ch->heap_len || p < h || p + len > h + ch->heap_len)
        return -1;
    return (int64_t)(p - ch->seg[ch->rank]);
}

static int blocked(ac_chan *ch, int phase, int64_t s) {
    ch->blocked_phase = phase;
    ch->blocked_s = s;
    return AC_BLOCKED;
}

static int finish(ac_chan *ch) {
    ch->active = 0;
    ch->ops++;
    for (int j = 0; j < ch->size; j++)  /* a rank gave this op (or a later one) up: not mine to decide */
        if (load_acq(&ctl(ch, j)[AC_W_GAVE_UP]) > ch->order)
            return AC_NOT_CLEAN;
    return ch->bells ? AC_BELLS : AC_DONE;
}

static int advance(ac_chan *ch, int64_t until) {
    const int me = ch->rank;
    const size_t item = ch->item;
    while (ch->step_index < ch->nsteps) {
        const int64_t *p = ch->prog + ch->pc;
        int64_t nstage = p[0];
        const int64_t *stage = p + 1, *w = stage + 4 * nstage;
        int64_t nwait = w[0];
        const int64_t *waits = w + 1, *rd = waits + nwait;
        int64_t nreads = rd[0];
        if (ch->phase == 0 && ch->slice_ns && ch->step_index > ch->slice_from && now_ns() >= ch->slice_until)
            return blocked(ch, 3, ac_step(ch));  /* this call has had its slice: the caller's loop turns */
        if (ch->phase == 0) {
            int64_t s = ac_step(ch) + 1;
            if ((nstage || ch->first) && !spin(ch, NULL, 0, s - 1, until))
                return blocked(ch, 0, s - 1);  /* my slot half is free once everyone is past step s - 2 */
            int half = (int)(s & 1);
            if (ch->first) {
                int64_t *d = &ctl(ch, me)[AC_W_DESC + half * AC_DESC_LEN];
                for (int k = 0; k < AC_DESC_FIELDS; k++)
                    __atomic_store_n(&d[k], ch->mine[k], __ATOMIC_RELAXED);
            }
            for (int64_t k = 0; k < nstage; k++) {
                const int64_t *st = stage + 4 * k;
                if (st[0] == AC_IN ? (ch->in_off >= 0 || ch->in_addr >= 0) : (ch->out_off >= 0 || ch->out_addr >= 0))
                    continue;  /* registered, or read by cma: peers read it where it lies */
                size_t bytes = (size_t)(st[2] - st[1]) * item, at = (size_t)st[3] * item;
                if (!bytes)
                    continue;
                if (at > ch->half[me] || bytes > ch->half[me] - at) {
                    snprintf(ch->error, sizeof ch->error, "staging %zu bytes at %zu passes my slot of %zu bytes",
                             bytes, at, ch->half[me]);
                    return AC_CORRUPT;
                }
                memcpy(ch->seg[me] + ch->slot[me][half] + at, ch->buf[st[0]] + (size_t)st[1] * item, bytes);
            }
            publish(ch, s);
            ch->s = s;
            ch->phase = 1;
        }
        int64_t s = ch->s;
        int half = (int)(s & 1);
        if (ch->first ? !spin(ch, NULL, 0, s, until) : (nwait && !spin(ch, waits, nwait, s, until)))
            return blocked(ch, 1, s);
        if (ch->first) {
            ch->first = 0;
            for (int j = 0; j < ch->size; j++) {
                if (j == me)
                    continue;
                const int64_t *d = &ctl(ch, j)[AC_W_DESC + half * AC_DESC_LEN];
                for (int k = 0; k < AC_DESC_FIELDS; k++)
                    ch->descs[j][k] = __atomic_load_n(&d[k], __ATOMIC_RELAXED);
            }
            memcpy(ch->descs[me], ch->mine, sizeof ch->mine);
            for (int j = 0; j < ch->size; j++) {
                if (j == me)
                    continue;
                if (memcmp(ch->descs[j], ch->mine, 4 * sizeof(int64_t)) != 0) {
                    ch->peer = j;
                    ch->active = 0;
                    return AC_MISMATCH;
                }
                if ((ch->descs[j][6] >= 0 || ch->descs[j][7] >= 0) && !ch->cma_min) {
                    snprintf(ch->error, sizeof ch->error, "rank %d lets its buffer be read in place, but this "
                             "channel does not read in place: a corrupted or foreign peer", j);
                    ch->active = 0;
                    return AC_CORRUPT;
                }
                for (int k = 4; k < AC_DESC_FIELDS; k++)
                    ch->zero_copy |= ch->descs[j][k] >= 0;
            }
            ch->zero_copy |= ch->in_off >= 0 || ch->out_off >= 0 || ch->in_addr >= 0 || ch->out_addr >= 0;
        }
        if (do_reads(ch, rd + 1, nreads, half) != 0)
            return AC_CORRUPT;
        if (me == ch->prog[7] && ch->prog[4] == AC_CODE_BROADCAST && write_back_parts(ch, stage, nstage) != 0)
            return AC_CORRUPT;
        /* past the reads: the step's scale regions, then the next step */
        const int64_t *q = rd + 1;
        for (int64_t r = 0; r < nreads; r++)
            q += 2 + 5 * q[1] + 3;
        int64_t nscale = q[0];
        if (ch->redop == AC_OP_AVG)
            for (int64_t k = 0; k < nscale; k++) {
                const int64_t *reg = q + 1 + 3 * k;
                ac_scale(ch->dtype, ch->buf[reg[0]] + (size_t)reg[1] * item, (size_t)(reg[2] - reg[1]),
                         ch->divisor);
            }
        ch->pc = (size_t)(q + 1 + 3 * nscale - ch->prog);
        ch->step_index++;
        ch->phase = 0;
    }
    if (ch->zero_copy) {  /* peers may still read my registered buffer: nobody returns one before all are done */
        if (ch->phase == 0) {
            ch->s = ac_step(ch) + 1;
            publish(ch, ch->s);
            ch->phase = 2;
        }
        if (!spin(ch, NULL, 0, ch->s, until))
            return blocked(ch, 2, ch->s);
    }
    return finish(ch);
}

int ac_run(ac_chan *ch, const int64_t *prog, size_t prog_len, void *inp, size_t in_len, void *out,
           size_t out_len, int dtype, int redop, int64_t seq, int64_t order) {
    size_t item = dtype ? ac_itemsize(dtype) : 1;
    if (!item || prog_len < AC_PROG_HEADER || (uint64_t)prog[8] * item > in_len ||
        (uint64_t)prog[9] * item > out_len)
        return AC_UNSUITABLE;
    ch->prog = prog;
    ch->prog_len = prog_len;
    ch->buf[AC_IN] = inp;
    ch->buf[AC_OUT] = out;
    ch->buf_len[AC_IN] = in_len;
    ch->buf_len[AC_OUT] = out_len;
    ch->item = item;
    ch->dtype = dtype;
    ch->redop = redop;
    ch->order = order;
    ch->divisor = prog[3] ? prog[3] : ch->size;
    ch->nsteps = prog[1];
    ch->pc = AC_PROG_HEADER;
    ch->step_index = 0;
    ch->phase = 0;
    ch->first = 1;
    ch->bells = 0;
    ch->active = 1;
    ch->base = ac_step(ch);
    ch->in_off = prog[2] ? heap_offset(ch, inp, in_len) : -1;
    ch->out_off = prog[2] ? heap_offset(ch, out, out_len) : -1;
    ch->zero_copy = 0;
    int64_t now = now_ns();
    ch->slice_until = now + ch->slice_ns;
    ch->slice_from = 0;
    int64_t kind = (int64_t)((uint64_t)prog[4] | (uint64_t)prog[5] << 8 | (uint64_t)dtype << 16 |
                             (uint64_t)redop << 24);
    /* a buffer large enough, not registered, where the schedule allows it: peers read it in place */
    ch->in_addr = prog[2] && ch->cma_min && ch->in_off < 0 && in_len >= ch->cma_min ? (int64_t)(uintptr_t)inp : -1;
    ch->out_addr = prog[2] && ch->cma_min && ch->out_off < 0 && out_len >= ch->cma_min ? (int64_t)(uintptr_t)out : -1;
    int64_t mine[AC_DESC_FIELDS] = {seq, kind, prog[6], prog[7], ch->in_off, ch->out_off, ch->in_addr, ch->out_addr};
    memcpy(ch->mine, mine, sizeof mine);
    return advance(ch, now + ch->spin_ns);
}

int ac_resume(ac_chan *ch) { return ac_resume_until(ch, 0); }

int ac_resume_until(ac_chan *ch, int64_t slice_until) {
    if (!ch->active) {
        snprintf(ch->error, sizeof ch->error, "no native op in progress on this channel");
        return AC_CORRUPT;
    }
    ch->bells = 0;
    int64_t now = now_ns();
    ch->slice_until = slice_until > 0 ? slice_until : now + ch->slice_ns;
    ch->slice_from = ch->step_index;
    return advance(ch, now + ch->spin_ns);
}
