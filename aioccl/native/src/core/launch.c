/* The GPU launcher (launch.h). */
#include "launch.h"

#include <sched.h>
#include <stdio.h>
#include <string.h>

int ac_launcher_init(ac_launcher *l, int form, int rank, int nranks, const unsigned long long *flags,
                     unsigned epoch) {
    if (nranks < 1 || nranks > AC_MAX_PEERS || rank < 0 || rank >= nranks || (form != 0 && form != 1))
        return -1;
    memset(l, 0, sizeof *l);
    pthread_mutex_init(&l->mu, NULL);
    l->form = form;
    l->rank = rank;
    l->nranks = nranks;
    memcpy(l->flags, flags, (size_t)nranks * sizeof *flags);
    l->own_flag = flags[rank];
    l->epoch = epoch;
    return 0;
}

void ac_launcher_destroy(ac_launcher *l) { pthread_mutex_destroy(&l->mu); }

static ac_driver_error launch_locked(ac_launcher *s, ac_plan *p, cu_handle stream, cu_handle ev, long long seq,
                                     int kind, double timeout) {
    ac_driver_error de = {CU_SUCCESS, NULL};
    if (s->closed) { /* the device path is being freed: nothing may reach its memory any more */
        de.rc = AC_LAUNCHER_CLOSED;
        de.call = "the GPU lane (closed)";
        return de;
    }
#define CALL(name, expr) do { if ((de.rc = (expr)) != CU_SUCCESS) { de.call = name; return de; } } while (0)
    /* a communicator's ops run one after the other on the GPU whatever streams they are issued on: this one
     * waits for the last one's event (never for its stream, which its owner may have destroyed since) */
    if (ev != NULL && s->last_ev != NULL && s->last_stream != stream)
        CALL("cuStreamWaitEvent", ac_cuda->stream_wait_event(stream, s->last_ev, 0));
    for (int k = 0; k < p->npieces; k++) {
        unsigned e = s->epoch + 1;
        __atomic_store_n(&s->epoch, e, __ATOMIC_RELEASE);
        ac_recent_op *r = &s->recent[e % AC_RECENT]; /* its epoch last: a reader checks it before and after */
        __atomic_store_n(&r->epoch, 0u, __ATOMIC_RELEASE);
        __atomic_store_n(&r->kind, kind, __ATOMIC_RELAXED);
        __atomic_store_n(&r->seq, seq, __ATOMIC_RELAXED);
        __atomic_store_n(&r->timeout_us, (long long)((timeout < 1e9 ? timeout : 1e9) * 1e6), __ATOMIC_RELAXED);
        __atomic_store_n(&r->epoch, e, __ATOMIC_RELEASE);
        if (!p->stream_form) { /* the kernel derives its epoch from its own flag (a CUDA graph replays it) */
            ac_launch *l = &p->l[k];
            CALL("cuLaunchKernel", ac_cuda->launch(l->fn, l->grid, 1, 1, l->threads, 1, 1, 0, stream, l->params, NULL));
            continue;
        }
        ac_launch *pub = &p->l[2 * k], *con = &p->l[2 * k + 1];
        pub->slots[pub->epoch_at] = e;
        con->slots[con->epoch_at] = e;
        CALL("cuLaunchKernel",
             ac_cuda->launch(pub->fn, pub->grid, 1, 1, pub->threads, 1, 1, 0, stream, pub->params, NULL));
        CALL("cuStreamWriteValue32", ac_cuda->write32(stream, s->own_flag, e, 0));
        for (int peer = 0; peer < s->nranks; peer++)
            if (peer != s->rank)
                CALL("cuStreamWaitValue32", ac_cuda->wait32(stream, s->flags[peer], e, CU_WAIT_GEQ));
        CALL("cuLaunchKernel",
             ac_cuda->launch(con->fn, con->grid, 1, 1, con->threads, 1, 1, 0, stream, con->params, NULL));
    }
    if (ev != NULL) {
        CALL("cuEventRecord", ac_cuda->event_record(ev, stream));
        s->last_ev = ev; /* (its in-flight slot holds the event until the slot is reused) */
        s->last_stream = stream;
    }
#undef CALL
    return de;
}

ac_driver_error ac_launcher_launch(ac_launcher *l, ac_plan *p, cu_handle stream, cu_handle ev, long long seq,
                                   int kind, double timeout, unsigned *epoch) {
    pthread_mutex_lock(&l->mu);
    ac_driver_error de = launch_locked(l, p, stream, ev, seq, kind, timeout);
    *epoch = l->epoch;
    pthread_mutex_unlock(&l->mu);
    return de;
}

ac_tracked *ac_launcher_oldest(ac_launcher *l) {
    return l->count > 0 ? &l->inflight[(l->head - l->count + AC_TRACKED) % AC_TRACKED] : NULL;
}

int ac_launcher_retire(ac_launcher *l) {
    ac_tracked *t = ac_launcher_oldest(l);
    if (t == NULL || t->state == AC_SLOT_RESERVED ||
        (t->state == AC_SLOT_LAUNCHED && ac_cuda->event_query(t->event) == CU_NOT_READY))
        return -1; /* (any other answer: the event will never say more; the op is over for the window) */
    l->count--;
    return (int)(t - l->inflight);
}

int ac_launcher_reserve(ac_launcher *l) {
    if (l->count == AC_TRACKED)
        return -1;
    int slot = l->head;
    l->inflight[slot].state = AC_SLOT_RESERVED;
    l->head = (l->head + 1) % AC_TRACKED;
    l->count++;
    return slot;
}

void ac_launcher_unreserve(ac_launcher *l, int slot) {
    if (l->count > 0 && slot == (l->head - 1 + AC_TRACKED) % AC_TRACKED) {
        l->head = slot;
        l->count--;
    }
}

void ac_launcher_track(ac_launcher *l, int slot, int ok, long long seq, int kind, double timeout, double deadline,
                       unsigned epoch) {
    ac_tracked *t = &l->inflight[slot];
    t->state = ok ? AC_SLOT_LAUNCHED : AC_SLOT_FAILED;
    t->seq = seq;
    t->kind = kind;
    t->timeout = timeout;
    t->deadline = deadline;
    t->epoch = epoch;
}

void ac_launcher_wait(cu_handle event, int launched) {
    if (launched)
        ac_cuda->event_sync(event);
    else /* another thread is launching it: its slot is its own until it says how that went */
        sched_yield();
}

int ac_launcher_recent(ac_launcher *l, unsigned e, long long *seq, int *kind, double *timeout) {
    ac_recent_op *at = &l->recent[e % AC_RECENT];
    unsigned epoch = __atomic_load_n(&at->epoch, __ATOMIC_ACQUIRE);
    *kind = __atomic_load_n(&at->kind, __ATOMIC_RELAXED);
    *seq = __atomic_load_n(&at->seq, __ATOMIC_RELAXED);
    long long us = __atomic_load_n(&at->timeout_us, __ATOMIC_RELAXED);
    *timeout = (double)us / 1e6;
    return epoch == e && epoch != 0 && __atomic_load_n(&at->epoch, __ATOMIC_ACQUIRE) == epoch;
}

unsigned ac_launcher_epoch(ac_launcher *l) { return __atomic_load_n(&l->epoch, __ATOMIC_ACQUIRE); }

void ac_launcher_close(ac_launcher *l) {
    pthread_mutex_lock(&l->mu);
    __atomic_store_n(&l->closed, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&l->mu);
}

int ac_launcher_closed(ac_launcher *l) { return __atomic_load_n(&l->closed, __ATOMIC_ACQUIRE); }

const char *ac_driver_error_text(ac_driver_error de, char *buf, size_t len) {
    char name[32];
    if (de.rc == AC_LAUNCHER_CLOSED)
        snprintf(buf, len, "GPU ops on this communicator are closed (its device path is freed)");
    else
        snprintf(buf, len, "%s failed: %s", de.call, ac_cuda_error_name(de.rc, name, sizeof name));
    return buf;
}
