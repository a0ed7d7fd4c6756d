/* The point-to-point lane for a caller outside Python: jax_ext's send, recv, sendrecv and ppermute as XLA
 * custom calls (xla_ffi.c), on XLA's buffers, from XLA's thread.
 *
 * Why here and not through the site's Python fallback: a jitted exchange of 8 bytes cost ~400 us that way
 * (the GIL, the views, the interrupt guard's thread, the engine's loop both ways), where the lane's send and
 * receive cost about a microsecond each.
 *
 * The lane's verbs read the engine's state (its queued sends, the mailbox, the connection), which the
 * engine's thread owns. So the caller borrows the engine as Placement.borrow does: a proxy thread's loop
 * holds its engine lock except while it waits for events, and the caller takes that lock (never waiting
 * for it: a busy engine is tried again after a yield) and the GIL, runs the verbs, and gives both back.
 * A receive whose message has not come spins the lane's spin with the lock held, then lets go, yields and
 * tries again, for up to PAIR_WAIT_S (the caller waits anyway; a hand-over to the engine costs far more);
 * meanwhile the engine may read the message in, and the next try takes it from the mailbox.
 *
 * Outcomes: ACPY_PAIR_DONE (both halves done), ACPY_PAIR_NOT_NOW (nothing done: the site's fallback runs the
 * op the engine's way) and ACPY_PAIR_SENT (the send is done, the receive is not: the fallback runs the
 * receive alone). An engine on the caller's loop (inline) lends nothing: ACPY_PAIR_NOT_NOW. */
#include <sched.h>
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL aioccl_native_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include "core/jitter.h"
#include "fast_lane.h"
#include "pair_lane.h"
#include "pair_lane_object.h"

#define PAIR_WAIT_S 0.02 /* as lane.h's NATIVE_WAIT_S: how long a native caller waits in C */

static PyObject *s_acquire, *s_release;

int acpy_pair_borrow(PairLane *self) {
    if (self->lock == NULL || self->lock == Py_None)
        return 0;
    PyObject *r = PyObject_CallMethodOneArg(self->lock, s_acquire, Py_False);
    int yes = r == NULL ? -1 : PyObject_IsTrue(r);
    Py_XDECREF(r);
    return yes;
}

int acpy_pair_give_back(PairLane *self, int wake) {
    PyObject *r = PyObject_CallMethodNoArgs(self->lock, s_release);
    int rc = r == NULL ? -1 : 0;
    Py_XDECREF(r);
    if (rc == 0 && wake) {
        r = PyObject_CallNoArgs(self->wake);
        rc = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    return rc;
}

/* The caller holds the engine: 1 on its thread, 2 its lock borrowed from another thread (give it back), 0
 * neither (inline, or an engine busy for longer than the pair's spin: the general way), -1 an error. A busy
 * engine is mostly reading a FIFO for a moment (a bell): it is given that moment, the GIL released. */
int acpy_pair_on_engine(PairLane *self) {
    if (PyThread_get_thread_ident() == self->thread_id)
        return 1;
    if (self->lock == Py_None)
        return 0;
    double until = acpy_work_monotonic() + (double)self->spin_ns * 1e-9;
    for (;;) {
        ac_jitter();
        int got = acpy_pair_borrow(self);
        if (got != 0 || acpy_work_monotonic() > until)
            return got > 0 ? 2 : got;
        Py_BEGIN_ALLOW_THREADS
        sched_yield();
        Py_END_ALLOW_THREADS
    }
}

static void fill(call *c, void *buf, size_t len, int peer, int code, long long tag) {
    c->arr = NULL;
    c->want = 0;
    c->native = 1, c->owner = 0;
    c->buf = (uint8_t *)buf;
    c->nbytes = len;
    c->peer = peer;
    c->code = code;
    c->tag = tag;
}

int acpy_pair_native(PyObject *obj, const acpy_pair_op *op) {
    PairLane *self = (PairLane *)obj;
    acpy_lane_busy = 0;
    if (!__atomic_load_n(&self->enabled, __ATOMIC_RELAXED) || (op->dest < 0 && op->source < 0))
        return ACPY_PAIR_NOT_NOW;
    PyGILState_STATE g = PyGILState_Ensure();
    if (self->lock == NULL || self->lock == Py_None) { /* (set once, at init) an inline engine lends nothing */
        PyGILState_Release(g);
        return ACPY_PAIR_NOT_NOW;
    }
    int sent = op->dest < 0, rc = ACPY_PAIR_NOT_NOW, timing = 1; /* (the engine never lent within the wait) */
    double until = acpy_work_monotonic() + PAIR_WAIT_S;
    for (;;) {
        int got = acpy_pair_borrow(self), r = 1, woke = 0;
        if (got < 0)
            break;
        if (got) {
            call c;
            c.why = ACPY_NO_BUSY;
            if (!sent) {
                fill(&c, op->send, op->send_len, op->dest, op->send_code, op->tag);
                r = acpy_pair_check(self, &c);
                if (r > 0)
                    r = acpy_pair_put(self, &c);
                sent = r > 0;
            }
            if (r > 0 && op->source >= 0) {
                fill(&c, op->recv, op->recv_len, op->source, op->recv_code, op->tag);
                r = acpy_pair_check(self, &c);
                if (r > 0)
                    r = acpy_pair_get(self, &c);
                woke = r == 3;
            }
            if (acpy_pair_give_back(self, woke) < 0)
                break;
            if (r == 1 || r == 3) {
                rc = ACPY_PAIR_DONE;
                break;
            }
            timing = r == 2 || c.why == ACPY_NO_BUSY || c.why == ACPY_NO_SPUN || c.why == ACPY_NO_FULL;
            if (r != 2) /* the general way's (or an error): the fallback says what */
                break;
        }
        if (acpy_work_monotonic() > until)
            break;
        Py_BEGIN_ALLOW_THREADS
        sched_yield();
        Py_END_ALLOW_THREADS
    }
    if (rc != ACPY_PAIR_DONE && sent && op->dest >= 0)
        rc = ACPY_PAIR_SENT;
    acpy_lane_busy = rc == ACPY_PAIR_NOT_NOW && timing;
    PyErr_Clear(); /* (the general way meets whatever went wrong here again, and reports it) */
    PyGILState_Release(g);
    return rc;
}

int acpy_pair_native_ready(void) {
    if (s_acquire == NULL && (s_acquire = PyUnicode_InternFromString("acquire")) == NULL)
        return -1;
    if (s_release == NULL && (s_release = PyUnicode_InternFromString("release")) == NULL)
        return -1;
    return 0;
}
