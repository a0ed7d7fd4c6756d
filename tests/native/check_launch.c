/* The GPU launcher (core/launch.c) without Python and without a GPU: the core's driver table is loaded
 * from tests/native/standin_cuda.c, which records every call, so these checks see what would reach the GPU.
 * Part of check_core (tests/test_native.py builds both with AddressSanitizer and UBSan). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_driver.h"
#include "launch.h"

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c); exit(1); } } while (0)

typedef struct { /* standin_cuda.c's record */
    int call; /* 1 launch, 2 write32, 3 wait32, 4 event record, 5 stream wait event, 6 event sync */
    void *handle, *stream;
    unsigned long long addr;
    unsigned value, grid, threads;
    unsigned long long args[24];
} record;

static int (*count)(void);
static const record *(*log_)(void);
static void (*reset)(void);
static void (*fail)(int call, int rc);
static void (*complete_all)(void);
static void (*set_nargs)(int n);

#define H(x) ((cu_handle)(unsigned long long)(x))

/* a plan of `pieces` pieces in the stream form (publish, consume) or the spin form, 2 argument slots each,
 * the epoch in slot 1 */
static ac_plan make_plan(int pieces, int stream_form) {
    int per = stream_form ? 2 : 1;
    ac_plan p = {pieces, stream_form, calloc((size_t)(pieces * per), sizeof(ac_launch))};
    CHECK(p.l != NULL);
    for (int k = 0; k < pieces * per; k++) {
        ac_launch *l = &p.l[k];
        l->fn = H(0xf00 + k);
        l->grid = 2;
        l->threads = 64;
        l->nargs = 2;
        l->epoch_at = 1;
        l->slots[0] = 0xa000 + (unsigned long long)k;
        for (int j = 0; j < l->nargs; j++)
            l->params[j] = &l->slots[j];
    }
    return p;
}

static void test_stream_form(void) {
    ac_launcher l;
    unsigned long long flags[3] = {0x100, 0x200, 0x300};
    CHECK(ac_launcher_init(&l, 1, 1, 3, flags, 40) == 0);
    ac_plan p = make_plan(2, 1);
    int slot = ac_launcher_reserve(&l);
    CHECK(slot == 0 && l.count == 1);
    l.inflight[slot].event = H(7);
    reset();
    unsigned epoch = 0;
    ac_driver_error de = ac_launcher_launch(&l, &p, H(0x51), H(7), 12, 3, 2.5, &epoch);
    CHECK(de.rc == CU_SUCCESS && epoch == 42);
    ac_launcher_track(&l, slot, 1, 12, 3, 2.5, 100.0, epoch);
    /* per piece: publish, my flag := epoch, a wait on each peer's flag, consume; then the event */
    const record *r = log_();
    CHECK(count() == 2 * 5 + 1);
    for (unsigned piece = 0; piece < 2; piece++) {
        const record *q = &r[5 * piece];
        unsigned e = 41 + piece;
        CHECK(q[0].call == 1 && q[0].handle == H(0xf00 + 2 * piece) && q[0].stream == H(0x51) && q[0].args[1] == e);
        CHECK(q[1].call == 2 && q[1].addr == 0x200 && q[1].value == e);
        CHECK(q[2].call == 3 && q[2].addr == 0x100 && q[2].value == e);
        CHECK(q[3].call == 3 && q[3].addr == 0x300 && q[3].value == e);
        CHECK(q[4].call == 1 && q[4].handle == H(0xf01 + 2 * piece) && q[4].args[1] == e);
    }
    CHECK(r[10].call == 4 && r[10].handle == H(7) && r[10].stream == H(0x51));
    /* the op that ran an epoch, read without the mutex; an epoch never launched is not found */
    long long seq;
    int kind;
    double timeout;
    CHECK(ac_launcher_recent(&l, 41, &seq, &kind, &timeout) && seq == 12 && kind == 3 && timeout == 2.5);
    CHECK(!ac_launcher_recent(&l, 43, &seq, &kind, &timeout));
    /* in flight: the op stays until its event completes */
    CHECK(ac_launcher_oldest(&l)->seq == 12 && ac_launcher_retire(&l) == -1);
    complete_all();
    CHECK(ac_launcher_retire(&l) == slot && l.count == 0 && ac_launcher_oldest(&l) == NULL);
    /* the next op on another stream first waits for the last op's event */
    slot = ac_launcher_reserve(&l);
    l.inflight[slot].event = H(8);
    reset();
    de = ac_launcher_launch(&l, &p, H(0x52), H(8), 13, 3, 2.5, &epoch);
    CHECK(de.rc == CU_SUCCESS && epoch == 44 && log_()[0].call == 5 && log_()[0].handle == H(7) &&
          log_()[0].stream == H(0x52));
    ac_launcher_track(&l, slot, 1, 13, 3, 2.5, 100.0, epoch);
    /* a driver error names its call; the op's slot fails, and retires without asking its event */
    slot = ac_launcher_reserve(&l);
    fail(1, 700);
    de = ac_launcher_launch(&l, &p, H(0x52), H(9), 14, 3, 2.5, &epoch);
    char text[160];
    CHECK(de.rc == 700 && strcmp(de.call, "cuLaunchKernel") == 0);
    CHECK(strstr(ac_driver_error_text(de, text, sizeof text), "cuLaunchKernel failed: CUDA_ERROR_ILLEGAL_ADDRESS"));
    ac_launcher_track(&l, slot, 0, 14, 3, 2.5, 100.0, epoch);
    complete_all();
    CHECK(ac_launcher_retire(&l) >= 0 && ac_launcher_retire(&l) == slot && l.count == 0);
    /* closed: nothing launches any more */
    ac_launcher_close(&l);
    reset();
    de = ac_launcher_launch(&l, &p, H(0x52), NULL, 15, 3, 2.5, &epoch);
    CHECK(de.rc == AC_LAUNCHER_CLOSED && count() == 0 && ac_launcher_closed(&l));
    free(p.l);
    ac_launcher_destroy(&l);
}

static void test_spin_form_and_the_window_bound(void) {
    ac_launcher l;
    unsigned long long flags[2] = {0x100, 0x200};
    CHECK(ac_launcher_init(&l, 0, 0, 2, flags, 0) == 0);
    CHECK(ac_launcher_init(&l, 2, 0, 2, flags, 0) == -1 && ac_launcher_init(&l, 0, 2, 2, flags, 0) == -1);
    CHECK(ac_launcher_init(&l, 0, 0, AC_MAX_PEERS + 1, flags, 0) == -1);
    CHECK(ac_launcher_init(&l, 0, 0, 2, flags, 0) == 0);
    ac_plan p = make_plan(3, 0);
    reset();
    unsigned epoch;
    CHECK(ac_launcher_launch(&l, &p, H(0x51), NULL, 1, 0, 1.0, &epoch).rc == CU_SUCCESS && epoch == 3);
    CHECK(count() == 3); /* one kernel per piece, no event: an untracked op (a graph's capture) */
    for (int k = 0; k < 3; k++)
        CHECK(log_()[k].call == 1 && log_()[k].handle == H(0xf00 + k));
    /* every slot in use: no more until the oldest retires; a reservation given back is free again */
    for (int k = 0; k < AC_TRACKED; k++) {
        int slot = ac_launcher_reserve(&l);
        CHECK(slot == k);
        l.inflight[slot].event = H(100 + k);
        ac_launcher_track(&l, slot, 1, k, 0, 1.0, 1.0, 0);
    }
    CHECK(ac_launcher_reserve(&l) == -1);
    complete_all(); /* (no event was recorded: each reads as complete) */
    CHECK(ac_launcher_retire(&l) == 0 && ac_launcher_reserve(&l) == 0 && l.count == AC_TRACKED);
    ac_launcher_unreserve(&l, 0);
    CHECK(l.count == AC_TRACKED - 1 && ac_launcher_reserve(&l) == 0);
    free(p.l);
    ac_launcher_destroy(&l);
}

typedef struct {
    ac_launcher *l;
    ac_plan *p;
    int id;
} launcher_arg;

static void *launch_many(void *arg) {
    launcher_arg *a = arg;
    for (int k = 0; k < 500; k++) {
        unsigned epoch;
        CHECK(ac_launcher_launch(a->l, a->p, H(0x60 + a->id), NULL, k, a->id, 1.0, &epoch).rc == CU_SUCCESS);
    }
    return NULL;
}

/* ops from several threads: each op's pieces get consecutive epochs, and every epoch is used once */
static void test_threads(void) {
    ac_launcher l;
    unsigned long long flags[2] = {0x100, 0x200};
    CHECK(ac_launcher_init(&l, 1, 0, 2, flags, 0) == 0);
    ac_plan p = make_plan(2, 1);
    reset();
    pthread_t t[2];
    launcher_arg args[2] = {{&l, &p, 1}, {&l, &p, 2}};
    for (int k = 0; k < 2; k++)
        CHECK(pthread_create(&t[k], NULL, launch_many, &args[k]) == 0);
    for (int k = 0; k < 2; k++)
        pthread_join(t[k], NULL);
    CHECK(ac_launcher_epoch(&l) == 2000);
    const record *r = log_();
    int n = count(); /* 1000 ops of 2 pieces: publish, a flag write, a wait, consume each */
    CHECK(n == 8000);
    for (int op = 0; op < n / 8; op++) {
        const record *q = &r[8 * op];
        CHECK(q[0].args[1] == (unsigned)(2 * op + 1) && q[4].args[1] == (unsigned)(2 * op + 2));
        CHECK(q[0].stream == q[7].stream); /* one op's calls on one stream: nothing interleaved */
    }
    free(p.l);
    ac_launcher_destroy(&l);
}

void test_launcher(const char *standin) {
    if (standin == NULL) {
        printf("launcher: skipped (no stand-in driver given)\n");
        return;
    }
    char why[512];
    CHECK(ac_cuda_load(standin, why, sizeof why) == 0);
    void *lib = dlopen(standin, RTLD_NOW);
    CHECK(lib != NULL);
    *(void **)&count = dlsym(lib, "standin_count");
    *(void **)&log_ = dlsym(lib, "standin_log");
    *(void **)&reset = dlsym(lib, "standin_reset");
    *(void **)&fail = dlsym(lib, "standin_fail");
    *(void **)&complete_all = dlsym(lib, "standin_complete_all");
    *(void **)&set_nargs = dlsym(lib, "standin_nargs");
    CHECK(count && log_ && reset && fail && complete_all && set_nargs);
    set_nargs(2); /* the stand-in reads this many argument slots of each launch */
    test_stream_form();
    test_spin_form_and_the_window_bound();
    test_threads();
    printf("launcher checks passed\n");
}
