/* The native core's own tests, in C: built with AddressSanitizer and UndefinedBehaviorSanitizer and run by
 * tests/test_native.py. Ranks are threads over segments laid out as aioccl/transport/shm/segment.py lays them out.
 *
 *   protocol: n ranks run many all_reduce/all_gather ops back to back (spinning briefly, resuming when
 *             blocked), every element checked; a mismatched call is found on every rank; again with every
 *             buffer read in place (process_vm_readv of this very process: the ranks are its threads);
 *   fuzz:     the readers of shared memory (channel set-up, descriptors, registered offsets, in-place
 *             addresses, programs)
 *             fed random and hostile contents: every run ends in an allowed code, never outside a mapping;
 *   halves:   float16 and bfloat16 conversions round-trip every value;
 *   launch:   the GPU launcher against the stand-in driver given as argv[2] (check_launch.c);
 *   fifo:     a shared-memory pair's FIFO and its frames, streamed between threads and fuzzed (check_fifo.c).
 * Only core/ is linked: the pure-C layer builds and runs without Python's headers or library. */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "channel.h"
#include "gate.h"
#include "reduce.h"

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c); exit(1); } } while (0)

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint64_t rnd(void) {  /* splitmix64: the same sequence every run */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

typedef struct {
    int n;
    size_t half, heap, len;
    uint8_t *seg[AC_MAX_RANKS];
} world;

static void make_world(world *w, int n, size_t half, size_t heap) {
    w->n = n;
    w->half = half;
    w->heap = heap;
    w->len = AC_CONTROL_BYTES + 2 * half + heap;
    for (int j = 0; j < n; j++) {
        CHECK(posix_memalign((void **)&w->seg[j], 4096, w->len) == 0);
        memset(w->seg[j], 0, w->len);
        int64_t *c = (int64_t *)(void *)w->seg[j];
        c[AC_W_HALF] = (int64_t)half;
        c[AC_W_HEAP] = (int64_t)heap;
        c[AC_W_HEAP_OFF] = (int64_t)(AC_CONTROL_BYTES + 2 * half);
        c[AC_W_PID] = (int64_t)getpid();
    }
}

static void free_world(world *w) {
    for (int j = 0; j < w->n; j++)
        free(w->seg[j]);
}

/* a flat all_reduce of `count` elements: one step, everyone stages IN, reduces all ranks' slots into OUT */
static size_t prog_all_reduce(int64_t *p, int n, int64_t count) {
    size_t k = 0;
    int64_t head[AC_PROG_HEADER] = {AC_PROG_MAGIC, 1, 0, 0, 1, 1, count, 0, count, count};
    memcpy(p, head, sizeof head);
    k = AC_PROG_HEADER;
    p[k++] = 1;  /* stage IN[0:count] at slot 0 */
    p[k++] = AC_IN; p[k++] = 0; p[k++] = count; p[k++] = 0;
    p[k++] = 0;  /* the first step waits for everyone anyway */
    p[k++] = 1;  /* one read: reduce every rank's slot into OUT */
    p[k++] = 1; p[k++] = n;
    for (int j = 0; j < n; j++) {
        p[k++] = j; p[k++] = AC_IN; p[k++] = 0; p[k++] = count; p[k++] = 0;
    }
    p[k++] = AC_OUT; p[k++] = 0; p[k++] = count;
    p[k++] = 0;  /* no scale */
    return k;
}

/* all_gather of `count` elements per rank: everyone stages IN, fetches each rank's slot into OUT block j */
static size_t prog_all_gather(int64_t *p, int n, int64_t count) {
    int64_t head[AC_PROG_HEADER] = {AC_PROG_MAGIC, 1, 0, 0, 3, 2, count, 0, count, count * n};
    memcpy(p, head, sizeof head);
    size_t k = AC_PROG_HEADER;
    p[k++] = 1;
    p[k++] = AC_IN; p[k++] = 0; p[k++] = count; p[k++] = 0;
    p[k++] = 0;
    p[k++] = n;
    for (int j = 0; j < n; j++) {
        p[k++] = 0; p[k++] = 1;
        p[k++] = j; p[k++] = AC_IN; p[k++] = 0; p[k++] = count; p[k++] = 0;
        p[k++] = AC_OUT; p[k++] = j * count; p[k++] = (j + 1) * count;
    }
    p[k++] = 0;
    return k;
}

/* broadcast of `count` elements from `root`: the root stages IN, every rank fetches the root's slot into OUT
 * (run in place: a root whose buffer is read in place writes the back of it into its receivers' buffers) */
static size_t prog_broadcast(int64_t *p, int n, int64_t count, int root, int rank) {
    int64_t head[AC_PROG_HEADER] = {AC_PROG_MAGIC, 1, 0, 0, AC_CODE_BROADCAST, 2, count, root, count, count};
    memcpy(p, head, sizeof head);
    size_t k = AC_PROG_HEADER;
    p[k++] = rank == root;
    if (rank == root) {
        p[k++] = AC_IN; p[k++] = 0; p[k++] = count; p[k++] = 0;
    }
    p[k++] = rank != root;
    if (rank != root)
        p[k++] = root;
    p[k++] = 1;
    p[k++] = 0; p[k++] = 1;
    p[k++] = root; p[k++] = AC_IN; p[k++] = 0; p[k++] = count; p[k++] = 0;
    p[k++] = AC_OUT; p[k++] = 0; p[k++] = count;
    p[k++] = 0;
    (void)n;
    return k;
}

typedef struct {
    world *w;
    int rank, ops, count, mismatch_at, cma;
    int failures;
} rank_job;

static int run_to_end(ac_chan *ch, int rc) {
    int spins = 0;
    while (rc == AC_BLOCKED) {
        CHECK(++spins < 50000000);
        rc = ac_resume(ch);
    }
    return rc;
}

static void *rank_main(void *arg) {
    rank_job *job = arg;
    world *w = job->w;
    ac_chan ch;
    CHECK(ac_chan_init(&ch, job->rank, w->n, w->seg, (size_t[AC_MAX_RANKS]){[0 ... AC_MAX_RANKS - 1] = w->len},
                       20000, 1) == 0);
    if (job->cma)
        CHECK(ac_chan_cma(&ch, 1) == 0);
    int64_t prog[4096];
    float in[64], out[64 * AC_MAX_RANKS];
    for (int op = 0; op < job->ops; op++) {
        int gather = op % 3 == 2, bcast = op % 3 == 1, root = op / 3 % w->n;
        int count = job->count - (op == job->mismatch_at && job->rank == 1 ? 1 : 0);
        size_t len = gather ? prog_all_gather(prog, w->n, count)
                     : bcast ? prog_broadcast(prog, w->n, count, root, job->rank) : prog_all_reduce(prog, w->n, count);
        prog[2] = job->cma;  /* zero_copy: peers may read my buffers where they lie */
        CHECK(ac_prog_check(prog, len, job->rank, w->n, NULL, 0) == 0);
        for (int i = 0; i < count; i++)
            in[i] = (float)(job->rank + 1 + op % 7 + i);
        for (int i = 0; i < 64 * w->n; i++)
            out[i] = -1e30f;  /* poisoned */
        if (bcast && job->rank == root)
            memcpy(out, in, sizeof in);
        int rc = run_to_end(&ch, bcast ? ac_run(&ch, prog, len, out, sizeof in, out, sizeof in, AC_DT_F32, AC_OP_SUM,
                                                op, op)  /* in place, as comm.broadcast(x) */
                                       : ac_run(&ch, prog, len, in, sizeof in, out, sizeof out, AC_DT_F32, AC_OP_SUM,
                                                op, op));
        if (op == job->mismatch_at) {  /* every rank finds it */
            CHECK(rc == AC_MISMATCH);
            continue;
        }
        CHECK(rc == AC_DONE || rc == AC_BELLS);
        for (int i = 0; i < count; i++) {
            if (bcast) {
                job->failures += out[i] != (float)(root + 1 + op % 7 + i);
            } else if (gather) {
                for (int j = 0; j < w->n; j++)
                    job->failures += out[j * count + i] != (float)(j + 1 + op % 7 + i);
            } else {
                float want = 0;
                for (int j = 0; j < w->n; j++)
                    want += (float)(j + 1 + op % 7 + i);
                job->failures += out[i] != want;
            }
        }
    }
    if (job->cma)  /* every rank was a broadcast's root: it wrote into its receivers' buffers */
        CHECK(ch.cma_reads > 0 && ch.cma_writes > 0);
    else
        CHECK(ch.cma_writes == 0);
    ac_chan_free(&ch);
    return NULL;
}

static void test_protocol(void) {
    for (int cma = 0; cma < 2; cma++)
    for (int n = 2; n <= 4; n++) {
        world w;
        make_world(&w, n, 4096, 4096);
        pthread_t t[AC_MAX_RANKS];
        rank_job jobs[AC_MAX_RANKS];
        for (int r = 0; r < n; r++) {
            jobs[r] = (rank_job){&w, r, 3000, 16, 1500, cma, 0};
            CHECK(pthread_create(&t[r], NULL, rank_main, &jobs[r]) == 0);
        }
        for (int r = 0; r < n; r++) {
            pthread_join(t[r], NULL);
            CHECK(jobs[r].failures == 0);
        }
        free_world(&w);
        printf("protocol: %d ranks x 3000 ops exact, the mismatch found by every rank%s\n", n,
               cma ? ", buffers read in place, broadcast roots writing into their receivers" : "");
    }
}

/* -- fuzz --------------------------------------------------------------------------------------- */
static void fill_random(uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = rnd();
        memcpy(p + i, &v, n - i < 8 ? n - i : 8);
    }
}

static int64_t hostile(void) {  /* values a corrupted peer might leave: edges, huge, negative */
    static const int64_t edge[] = {0, -1, 1, 4095, 4096, 8192, INT64_MAX, INT64_MIN, INT64_MAX - 8, 1LL << 40};
    return rnd() % 2 ? edge[rnd() % (sizeof edge / sizeof edge[0])] : (int64_t)(rnd() % 20000) - 100;
}

static void test_fuzz_channel(int iterations) {
    int64_t prog[4096];
    float in[64], out[64 * 4];
    int outcomes[8] = {0};
    for (int it = 0; it < iterations; it++) {
        int n = 2 + (int)(rnd() % 3), me = (int)(rnd() % (uint64_t)n);
        world w;
        make_world(&w, n, 4096, 4096);
        for (int j = 0; j < n; j++) {
            if (j == me)
                continue;
            fill_random(w.seg[j], w.len);  /* a peer's whole segment is garbage ... */
            int64_t *c = (int64_t *)(void *)w.seg[j];
            if (rnd() % 4)  /* ... mostly with a plausible slot size, so the readers behind it are reached */
                c[AC_W_HALF] = rnd() % 2 ? 4096 : hostile();
            c[AC_W_CTR] = rnd() % 3 ? INT64_MAX / 2 : hostile();
            c[AC_W_SLEEP] = (int64_t)(rnd() % 2);
            c[AC_W_GAVE_UP] = rnd() % 4 ? 0 : hostile();
            c[AC_W_PID] = rnd() % 4 ? (int64_t)getpid() : hostile();
        }
        ac_chan ch;
        size_t lens[AC_MAX_RANKS];
        for (int j = 0; j < n; j++)
            lens[j] = w.len;
        if (ac_chan_init(&ch, me, n, w.seg, lens, 0, 0) != 0) {
            outcomes[7]++;
            free_world(&w);
            continue;
        }
        int cma = (int)(rnd() % 2);
        if (cma && ac_chan_cma(&ch, 1) != 0) {
            outcomes[7]++;
            ac_chan_free(&ch);
            free_world(&w);
            continue;
        }
        /* a broadcast from rank 0, in place: as its root this rank writes into the peers' (hostile) buffers */
        int pick = (int)(rnd() % 3), gather = pick == 1, bcast = pick == 2, count = 1 + (int)(rnd() % 16);
        size_t len = gather ? prog_all_gather(prog, n, count)
                     : bcast ? prog_broadcast(prog, n, count, 0, me) : prog_all_reduce(prog, n, count);
        prog[2] = (int64_t)(rnd() % 2);
        /* the peers' descriptors agree with mine (else a mismatch ends it before any data is read) but
         * point their registered buffers anywhere */
        int redop = gather || bcast ? 0 : AC_OP_SUM;
        int64_t kind = prog[4] | prog[5] << 8 | (int64_t)AC_DT_F32 << 16 | (int64_t)redop << 24;
        for (int j = 0; j < n; j++) {
            if (j == me)
                continue;
            for (int half = 0; half < 2; half++) {
                int64_t *d = (int64_t *)(void *)w.seg[j] + AC_W_DESC + half * AC_DESC_LEN;
                if (rnd() % 5) {
                    d[0] = it;
                    d[1] = kind;
                    d[2] = count;
                    d[3] = 0;
                }
                d[4] = rnd() % 2 ? -1 : hostile();
                d[5] = rnd() % 2 ? -1 : hostile();
                d[6] = rnd() % 2 ? -1 : hostile();  /* an address in the peer's process: the kernel checks it */
                d[7] = rnd() % 2 ? -1 : hostile();
            }
        }
        int rc = bcast ? ac_run(&ch, prog, len, out, sizeof in, out, sizeof in, AC_DT_F32, redop, it, it)
                       : ac_run(&ch, prog, len, in, sizeof in, out, sizeof out, AC_DT_F32, redop, it, it);
        CHECK(rc == AC_DONE || rc == AC_BELLS || rc == AC_BLOCKED || rc == AC_MISMATCH || rc == AC_CORRUPT ||
              rc == AC_NOT_CLEAN);
        outcomes[-rc]++;
        ac_reset(&ch);
        ac_chan_free(&ch);
        free_world(&w);
    }
    printf("fuzz channel: %d runs: done %d, blocked %d, mismatch %d, not clean %d, corrupt %d, ring %d, "
           "refused at set-up %d\n", iterations, outcomes[0], outcomes[1], outcomes[2], outcomes[3], outcomes[4],
           outcomes[6], outcomes[7]);
    CHECK(outcomes[4] > 0 && outcomes[2] > 0 && outcomes[7] > 0);  /* the hostile cases were reached */
}

static void test_fuzz_programs(int iterations) {
    int64_t p[256];
    int accepted = 0;
    world w;
    make_world(&w, 3, 4096, 0);
    float in[4096], out[4096];
    for (int it = 0; it < iterations; it++) {
        size_t len = rnd() % 64;
        for (size_t k = 0; k < len; k++)
            p[k] = rnd() % 3 ? (int64_t)(rnd() % 6) : hostile();
        if (len > 0 && rnd() % 2)
            p[0] = AC_PROG_MAGIC;
        if (len > 2 && rnd() % 2)
            p[1] = 1;
        if (ac_prog_check(p, len, 0, 3, NULL, 0) != 0)
            continue;
        accepted++;
        ac_chan ch;
        size_t lens[3] = {w.len, w.len, w.len};
        CHECK(ac_chan_init(&ch, 0, 3, w.seg, lens, 0, 0) == 0);
        int rc = ac_run(&ch, p, len, in, sizeof in, out, sizeof out, AC_DT_F32, AC_OP_SUM, it, it);
        CHECK(rc <= 0 && rc >= AC_BELLS);
        ac_chan_free(&ch);
    }
    /* also programs the lowering would make, with one word broken */
    for (int it = 0; it < iterations; it++) {
        size_t len = prog_all_gather(p, 3, 1 + (int64_t)(rnd() % 8));
        p[AC_PROG_HEADER + rnd() % (len - AC_PROG_HEADER)] = hostile();
        if (ac_prog_check(p, len, 0, 3, NULL, 0) == 0)
            accepted++;
    }
    free_world(&w);
    printf("fuzz programs: %d random and broken programs, %d accepted and run safely\n", 2 * iterations, accepted);
}

static void test_halves(void) {
    int f16 = 0, bf16 = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ac_f16_to_f32((uint16_t)h);
        if (!isnan(f)) {
            CHECK(ac_f32_to_f16(f) == h);
            f16++;
        }
        float b = ac_bf16_to_f32((uint16_t)h);
        if (!isnan(b)) {
            CHECK(ac_f32_to_bf16(b) == h);
            bf16++;
        }
    }
    CHECK(ac_f32_to_f16(65520.0f) == 0x7c00u && ac_f32_to_f16(1e-8f) == 0 && ac_f32_to_bf16(1.00390625f) == 0x3f80u);
    printf("halves: %d float16 and %d bfloat16 values round-trip\n", f16, bf16);
}

/* -- the gate: an "engine" thread and a "native caller" share one channel's order -----------------------
 * Each op takes an order number; the engine takes numbers for its ops and admits them (holding them when
 * not next, as the Python channel does), native callers claim the channel when it is idle. Each side runs
 * GATE_HALF ops. Checked: ops run one at a time, exactly in order-number order, none lost, none twice. */
enum { GATE_HALF = 10000 };
static ac_gate gate;
static int64_t ran_upto = -1; /* the last order number run (written by whoever holds the channel) */
static int inside;            /* ops running now: must never exceed 1 */
static int64_t native_ops;

static void run_op(int64_t order) {
    if (__atomic_add_fetch(&inside, 1, __ATOMIC_ACQ_REL) != 1 || ran_upto != order - 1) {
        fprintf(stderr, "gate: op %lld ran beside another or out of order (last %lld)\n", (long long)order,
                (long long)ran_upto);
        abort();
    }
    ran_upto = order;
    __atomic_sub_fetch(&inside, 1, __ATOMIC_ACQ_REL);
}

static void *gate_native(void *arg) {
    (void)arg;
    int64_t order;
    while (__atomic_load_n(&native_ops, __ATOMIC_ACQUIRE) < GATE_HALF)
        if (ac_gate_claim(&gate, &order)) {
            run_op(order);
            __atomic_add_fetch(&native_ops, 1, __ATOMIC_ACQ_REL);
            (void)ac_gate_done(&gate, order);
        }
    return NULL;
}

static void test_gate(void) {
    ac_gate_init(&gate, 0);
    pthread_t t;
    pthread_create(&t, NULL, gate_native, NULL);  /* one native caller: the quota is exact */
    int64_t held[64];
    int nheld = 0, taken = 0, ran = 0;
    while (ran < GATE_HALF) {
        if (nheld < 64 && taken < GATE_HALF && rnd() % 3 == 0) {
            held[nheld++] = ac_gate_take(&gate); /* an engine op: issued now, admitted when its turn comes */
            taken++;
        }
        for (int k = 0; k < nheld; k++)
            if (ac_gate_admit(&gate, held[k])) {
                run_op(held[k]);
                ac_gate_finish(&gate);
                ran++;
                held[k--] = held[--nheld];
            }
    }
    pthread_join(t, NULL);
    if (ran_upto != 2 * GATE_HALF - 1 || native_ops != GATE_HALF) {
        fprintf(stderr, "gate: ran up to %lld, %lld native\n", (long long)ran_upto, (long long)native_ops);
        abort();
    }
    ac_gate_alarm(&gate);
    int64_t order;
    if (ac_gate_claim(&gate, &order)) {
        fprintf(stderr, "gate: claimed after the alarm\n");
        abort();
    }
}

void test_launcher(const char *standin); /* check_launch.c */
void test_fifo(int iterations);         /* check_fifo.c */

int main(int argc, char **argv) {
    int iterations = argc > 1 ? atoi(argv[1]) : 20000;
    test_halves();
    test_protocol();
    test_fuzz_channel(iterations);
    test_fuzz_programs(iterations);
    test_gate();
    test_launcher(argc > 2 ? argv[2] : NULL);
    test_fifo(iterations);
    printf("native core checks passed\n");
    return 0;
}
