/* The point-to-point lane's receive against the engine's mailbox (pair_lane_object.h): whether anything
 * posted or held there comes before it, and taking a message the engine held for it, as Mailbox.post_p2p
 * would (receives.py's Early: fully arrived, not a rendezvous, what the receive expects). Its queues are
 * looked up by the mailbox's own key (engine/mailbox.py's p2p_key: (world rank, ctx, tag)), built here as
 * pair_key() does; the lane checks that definition when it is made (pair_lane.c's same_key). */
#include <string.h>
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL aioccl_native_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include "pair_lane_object.h"

static PyObject *s_done_flag, *s_rts, *s_header, *s_view, *s_popleft, *s_free;

/* What in the mailbox comes before this receive: 1 nothing (its message is the first from that peer in the
 * FIFO), 2 a message held for it (*held: the first of (peer, communicator, tag), borrowed), 0 something the
 * general way must sort out (a receive posted before it, a wildcard, a probe, a lost peer), -1 an error */
static PyObject *pair_key(PairLane *self, call *c) { return Py_BuildValue("(OKL)", c->world, self->ctx, c->tag); }

int acpy_pair_ahead(PairLane *self, call *c, PyObject **held) {
    if (PyDict_GET_SIZE(self->wild) || PyList_GET_SIZE(self->probes))
        return 0;
    if (!PyDict_GET_SIZE(self->posted) && !PyDict_GET_SIZE(self->early))
        return PyDict_GET_SIZE(self->lost) ? 0 : 1;
    PyObject *key = pair_key(self, c);
    if (key == NULL)
        return -1;
    int in = PyDict_Contains(self->posted, key);
    PyObject *queue = in == 0 ? PyDict_GetItemWithError(self->early, key) : NULL;
    Py_DECREF(key);
    if (in != 0 || (queue == NULL && PyErr_Occurred()))
        return in < 0 || PyErr_Occurred() ? -1 : 0;
    if (queue == NULL)
        return PyDict_GET_SIZE(self->lost) ? 0 : 1;
    Py_ssize_t n = PyObject_Length(queue);
    if (n <= 0)
        return n < 0 ? -1 : 0;
    *held = PySequence_GetItem(queue, 0); /* (a new reference: the caller drops it) */
    return *held == NULL ? -1 : 2;
}

/* Take the message held for this receive (an Early that fully arrived, receives.py) into its buffer, as
 * the mailbox would on posting: 1 taken (the held one gone from its queue, its buffer back in the pool),
 * 0 not for the lane (still arriving, a rendezvous, or not what this receive expects: the general way
 * says why), -1 an error. */
int acpy_pair_take_held(PairLane *self, call *c, PyObject *e) {
    PyObject *done = PyObject_GetAttr(e, s_done_flag), *rts = PyObject_GetAttr(e, s_rts),
             *header = PyObject_GetAttr(e, s_header);
    int ok = done != NULL && rts != NULL && header != NULL;
    int fits = ok && done == Py_True && rts == Py_None && PyTuple_Check(header) && PyTuple_GET_SIZE(header) >= 7;
    if (fits) {
        long long kind = PyLong_AsLongLong(PyTuple_GET_ITEM(header, 0)), op = PyLong_AsLongLong(PyTuple_GET_ITEM(header, 1));
        long long dtype = PyLong_AsLongLong(PyTuple_GET_ITEM(header, 2));
        unsigned long long nbytes = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(header, 6));
        fits = !PyErr_Occurred() && kind == AC_FRAME_P2P && op == 0 && nbytes == c->nbytes &&
               (dtype == c->code || !nbytes);
        PyErr_Clear();
    }
    Py_XDECREF(done);
    Py_XDECREF(rts);
    Py_XDECREF(header);
    if (!ok || !fits)
        return ok ? 0 : -1;
    PyObject *view = PyObject_CallMethodNoArgs(e, s_view);
    if (view == NULL)
        return -1;
    Py_buffer b;
    int got = PyObject_GetBuffer(view, &b, PyBUF_SIMPLE);
    Py_DECREF(view);
    if (got < 0 || (size_t)b.len != c->nbytes)
        return got < 0 ? -1 : (PyBuffer_Release(&b), 0);
    uint8_t *dst = c->buf;
    if (c->nbytes >= NOGIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        memcpy(dst, b.buf, c->nbytes);
        Py_END_ALLOW_THREADS
    } else if (c->nbytes) {
        memcpy(dst, b.buf, c->nbytes);
    }
    PyBuffer_Release(&b);
    /* as Mailbox.post_p2p: off its queue (no empty queue kept), then its buffer back (Early.free) */
    PyObject *key = pair_key(self, c);
    PyObject *queue = key ? PyDict_GetItemWithError(self->early, key) : NULL;
    PyObject *first = queue ? PyObject_CallMethodNoArgs(queue, s_popleft) : NULL;
    int rc = first == e ? 0 : -1;
    if (rc == 0 && PyObject_Length(queue) == 0)
        rc = PyDict_DelItem(self->early, key);
    Py_XDECREF(first);
    Py_XDECREF(key);
    if (rc == 0) {
        PyObject *r = PyObject_CallMethodNoArgs(e, s_free);
        rc = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    if (rc < 0 && !PyErr_Occurred())
        PyErr_SetString(PyExc_RuntimeError, "PairLane: the held message's queue changed under the lane");
    return rc < 0 ? -1 : 1;
}

int acpy_pair_held_ready(void) {
    struct { PyObject **at; const char *s; } names[] = {
        {&s_done_flag, "done"}, {&s_rts, "rts"}, {&s_header, "header"}, {&s_view, "view"}, {&s_popleft, "popleft"},
        {&s_free, "free"},
    };
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if (*names[k].at == NULL && (*names[k].at = PyUnicode_InternFromString(names[k].s)) == NULL)
            return -1;
    return 0;
}
