/* The channel's gate (gate.h): a spin lock over a few counters, held for a handful of instructions. */
#include "gate.h"

#include <sched.h>

#include "jitter.h"

static void lock(ac_gate *g) {
    ac_jitter();
    for (int n = 0; __atomic_exchange_n(&g->lock, 1, __ATOMIC_ACQUIRE); n++)
        if (n > 64)
            sched_yield();  /* the holder was descheduled: let it run */
}

static void unlock(ac_gate *g) { __atomic_store_n(&g->lock, 0, __ATOMIC_RELEASE); }

void ac_gate_init(ac_gate *g, int64_t order) {
    g->lock = 0;
    g->order = g->next = order;
    g->engine_ops = 0;
    g->busy = g->want = g->alarm = 0;
}

int64_t ac_gate_take(ac_gate *g) {
    lock(g);
    int64_t o = g->order++;
    unlock(g);
    return o;
}

int ac_gate_claim(ac_gate *g, int64_t *order) {
    lock(g);
    int ok = !g->busy && !g->alarm && g->engine_ops == 0 && g->next == g->order;
    if (ok) {
        g->busy = 1;
        *order = g->order++;
    }
    unlock(g);
    return ok;
}

int ac_gate_done(ac_gate *g, int64_t order) {
    lock(g);
    g->busy = 0;
    g->next = order + 1;
    int wake = g->want;
    g->want = 0;
    unlock(g);
    return wake;
}

void ac_gate_drop(ac_gate *g) {
    lock(g);
    g->busy = 0;
    unlock(g);
}

int ac_gate_admit(ac_gate *g, int64_t order) {
    lock(g);
    int ok = !g->busy && order == g->next;
    if (ok) {
        g->next++;
        g->engine_ops++;
    } else {
        g->want = 1;
    }
    unlock(g);
    return ok;
}

void ac_gate_finish(ac_gate *g) {
    lock(g);
    if (g->engine_ops > 0)
        g->engine_ops--;
    unlock(g);
}

void ac_gate_alarm(ac_gate *g) {
    lock(g);
    g->alarm = 1;
    unlock(g);
}

int ac_gate_alarmed(ac_gate *g) {
    lock(g);
    int a = g->alarm;
    unlock(g);
    return a;
}

int ac_gate_busy(ac_gate *g) {
    lock(g);
    int b = g->busy;
    unlock(g);
    return b;
}

int64_t ac_gate_next(ac_gate *g) {
    lock(g);
    int64_t n = g->next;
    unlock(g);
    return n;
}

void ac_gate_set_next(ac_gate *g, int64_t next) {
    lock(g);
    g->next = next;
    unlock(g);
}
