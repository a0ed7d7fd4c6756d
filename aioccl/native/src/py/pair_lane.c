/* The point-to-point lane: comm.isend(x, peer, tag) and comm.irecv(buf, peer, tag) of a contiguous numpy
 * array to or from a same-host peer, over the pair's byte FIFOs (core/fifo.h), from the call to the done
 * Work in C. Its owner is aioccl/lanes/pair.py.
 *
 * Why: through the engine a small message costs ~20 Python calls a side (the Work, its tracking, the
 * posting, the header, the FIFO's memoryviews, the reader's state machine, a future and its callback),
 * some twenty microseconds where the copy costs tens of nanoseconds.
 *
 * The lane takes only what it can finish in the call without changing what any other path sees, and
 * answers None (nothing done: the general way) for anything else, before a byte moves:
 *
 *   send: the connection is a shared-memory pair, open, with nothing queued or half written before this
 *         frame (the engine's sends to that peer, its control frames), the frame fits the FIFO now, and
 *         the payload is within the eager limit. It writes the frame as ShmPairConnection.send_now does
 *         and rings the peer's bell unless the peer is watching the FIFO.
 *   recv: nothing in the mailbox can come before this receive or take its message: no receive posted
 *         and no message held for (peer, communicator, tag), no wildcard receive, no probe, the reader
 *         between frames, the peer not lost. Then the first frame in the FIFO is the next message from
 *         that peer: if it is this receive's (its tag, this communicator, its size and dtype) it is copied
 *         straight into the buffer. A frame that is not arrives in Python (None), and a receive whose
 *         message has not come spins for the pair's spin time, the GIL released, watching the FIFO; if
 *         nothing comes it answers False, and the general way posts it without spinning again.
 *
 * Both run while the caller holds the engine, outside a group, while the communicator is usable (its owner
 * switches `enabled` off otherwise): on the engine's thread (the inline engine: the caller's loop), or on
 * another thread with a proxy thread's idle engine borrowed for the call (its lock, taken without waiting:
 * a busy engine means the general way), as a small collective borrows it (pair_native.c). Everything read from the
 * FIFOs is checked (core/fifo.c); a corrupt FIFO is left to the general way, which ends the connection. */
#include "core/jitter.h"
#include "pair_lane.h"

#include <limits.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL aioccl_native_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <structmember.h>

#include "core/bell.h"
#include "pair_lane_object.h"

#define MAX_TAG ((1LL << 62) - 1)
#define PUBLISH_EVERY ((size_t)64 << 10) /* a large frame is published a piece at a time, as fifo.py does */
#define STREAM_SPIN_NS 20000000LL         /* starts.MAX_STREAM_SPIN_S: a frame streaming in is waited for */
enum { WORK_SLOT_STATUS = 17 };

static uint64_t wants; /* the last want's serial (core/fifo.h): one count for the process, since the lanes of
                       * several communicators share a pair's FIFOs and a serial must never repeat on one */
static PyObject *s_aborted, *s_closed, *s_lock, *s_locked, *s_control,
    *s_paused, *s_reader, *s_done, *s_got;

#define PAIR_REFS(self) {&(self)->engine, &(self)->conns, &(self)->queued, &(self)->posted, &(self)->early, \
    &(self)->wild, &(self)->probes, &(self)->lost, &(self)->pair_type, &(self)->group_var, &(self)->record, \
    &(self)->status_type, &(self)->dtype_code, &(self)->ranks, &(self)->lock, &(self)->wake, &(self)->wanted, \
    &(self)->put_off}

int64_t acpy_pair_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int PairLane_traverse(PairLane *self, visitproc visit, void *arg) {
    PyObject **refs[] = PAIR_REFS(self);
    for (size_t k = 0; k < sizeof refs / sizeof refs[0]; k++)
        Py_VISIT(*refs[k]);
    for (int k = 0; k < DTYPE_CACHE; k++)
        Py_VISIT(self->codes[k].descr);
    for (int k = 0; k < 2 * NAME_CACHE; k++) {
        Py_VISIT(self->names[k / NAME_CACHE][k % NAME_CACHE].name);
        Py_VISIT(self->names[k / NAME_CACHE][k % NAME_CACHE].status);
    }
    for (int k = 0; self->fifos != NULL && k < self->size; k++)
        Py_VISIT(self->fifos[k].conn);
    return acpy_work_maker_traverse(&self->wm, visit, arg);
}

static int PairLane_clear(PairLane *self) {
    PyObject **refs[] = PAIR_REFS(self);
    for (size_t k = 0; k < sizeof refs / sizeof refs[0]; k++)
        Py_CLEAR(*refs[k]);
    for (int k = 0; k < DTYPE_CACHE; k++)
        Py_CLEAR(self->codes[k].descr);
    for (int k = 0; k < 2 * NAME_CACHE; k++) {
        Py_CLEAR(self->names[k / NAME_CACHE][k % NAME_CACHE].name);
        Py_CLEAR(self->names[k / NAME_CACHE][k % NAME_CACHE].status);
    }
    for (int k = 0; self->fifos != NULL && k < self->size; k++)
        Py_CLEAR(self->fifos[k].conn);
    acpy_work_maker_clear(&self->wm);
    return 0;
}

static void PairLane_dealloc(PairLane *self) {
    PyObject_GC_UnTrack(self);
    PairLane_clear(self);
    PyMem_Free(self->bells);
    PyMem_Free(self->fifos);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* setup's field `name`, of `type` when given (a new reference; NULL and an error naming the field else) */
static PyObject *field(PyObject *setup, const char *name, PyTypeObject *type) {
    PyObject *v = PyObject_GetAttrString(setup, name);
    if (v != NULL && type != NULL && !PyObject_TypeCheck(v, type)) {
        PyErr_Format(PyExc_TypeError, "PairLane: setup.%s must be a %s, not %s", name, type->tp_name,
                     Py_TYPE(v)->tp_name);
        Py_CLEAR(v);
    }
    return v;
}

/* The mailbox's point-to-point key, as Python defines it (aioccl/engine/mailbox.py's p2p_key): this lane builds
 * (world rank, ctx, tag) itself (pair_held.c), so it checks once that the one definition is that very tuple */
static int same_key(PyObject *key) {
    PyObject *k = PyObject_CallFunction(key, "iii", 11, 22, 33);
    if (k == NULL)
        return -1;
    int ok = PyTuple_CheckExact(k) && PyTuple_GET_SIZE(k) == 3 && PyLong_AsLong(PyTuple_GET_ITEM(k, 0)) == 11 &&
             PyLong_AsLong(PyTuple_GET_ITEM(k, 1)) == 22 && PyLong_AsLong(PyTuple_GET_ITEM(k, 2)) == 33;
    Py_DECREF(k);
    if (!ok && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "PairLane: the mailbox's p2p_key is no longer (peer, ctx, tag): "
                                          "pair_held.c builds its keys so and must change with it");
    return ok ? 0 : -1;
}

/* a PairSetup's fields, in the order PairLane_init reads them */
enum { ENGINE, CONNS, QUEUED, POSTED, EARLY, WILD, PROBES, LOST, PAIR_TYPE, RANKS, WORK_TYPE, DONE_LOCK, HOME,
       GROUP_VAR, RECORD, STATUS_TYPE, DTYPE_CODE, ADDRS, LOCK, WAKE, WANTED, PUT_OFF, KEY, CTX, RANK, THREAD_ID,
       EAGER, SPIN_S, YIELD_CPU, BELL_FD, SLICE_S, STALL_S, NFIELDS };
/* each field's name, and its type when one is required */
static const struct { const char *name; PyTypeObject *type; } spec[NFIELDS] = {
    {"engine", NULL}, {"conns", &PyDict_Type}, {"queued_sends", &PyDict_Type}, {"posted", &PyDict_Type},
    {"early", &PyDict_Type}, {"wild", &PyDict_Type}, {"probes", &PyList_Type}, {"lost", &PyDict_Type},
    {"pair_type", &PyType_Type}, {"ranks", &PyTuple_Type}, {"work_type", &PyType_Type}, {"done_lock", NULL},
    {"home", NULL}, {"group_var", NULL}, {"record", NULL}, {"status_type", NULL}, {"dtype_code", NULL},
    {"bell_addresses", &PyTuple_Type}, {"lock", NULL}, {"wake", NULL}, {"wanted", NULL},
    {"put_off", &PyDict_Type}, {"key", NULL}, {"ctx", &PyLong_Type}, {"rank", &PyLong_Type},
    {"thread_id", &PyLong_Type}, {"eager", &PyLong_Type}, {"spin_s", &PyFloat_Type}, {"yield_cpu", NULL},
    {"bell_fd", &PyLong_Type}, {"slice_s", &PyFloat_Type}, {"stall_s", &PyFloat_Type},
};

/* the set-up's values (f: its fields by the enum above, the numbers read), checked against each other and kept */
static int keep(PairLane *self, PyObject *const *f, unsigned long long ctx, unsigned long thread_id, int rank,
                int yield_cpu, int fd, Py_ssize_t eager, double spin_s, double slice_s, double stall_s) {
    PyObject *engine = f[ENGINE], *conns = f[CONNS], *queued = f[QUEUED], *posted = f[POSTED], *early = f[EARLY],
             *wild = f[WILD], *probes = f[PROBES], *lost = f[LOST], *pair_type = f[PAIR_TYPE], *ranks = f[RANKS],
             *work_type = f[WORK_TYPE], *done_lock = f[DONE_LOCK], *home = f[HOME], *group_var = f[GROUP_VAR],
             *record = f[RECORD], *status_type = f[STATUS_TYPE], *dtype_code = f[DTYPE_CODE], *addrs = f[ADDRS],
             *lock = f[LOCK], *wake = f[WAKE], *wanted = f[WANTED], *put_off = f[PUT_OFF];
    Py_ssize_t n = PyTuple_GET_SIZE(ranks);
    if (n < 1 || rank < 0 || rank >= n || PyTuple_GET_SIZE(addrs) != n || !PyType_Check(pair_type) ||
        !PyContextVar_CheckExact(group_var) || eager < 0 || spin_s < 0 || slice_s <= 0 || stall_s <= 0 ||
        (lock != Py_None && !PyCallable_Check(wake)) || !PyCallable_Check(wanted)) {
        PyErr_SetString(PyExc_ValueError, "PairLane: inconsistent ranks, bell addresses, types or limits");
        return -1;
    }
    ac_bell *bells = PyMem_Calloc((size_t)n, sizeof *bells);
    pair_fifos *fifos = PyMem_Calloc((size_t)n, sizeof *fifos);
    if (bells == NULL || fifos == NULL)
        return PyMem_Free(bells), PyMem_Free(fifos), PyErr_NoMemory(), -1;
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *a = PyTuple_GET_ITEM(addrs, j), *w = PyTuple_GET_ITEM(ranks, j);
        if (!PyBytes_Check(a) || ac_bell_set(&bells[j], PyBytes_AS_STRING(a), (size_t)PyBytes_GET_SIZE(a)) < 0 ||
            !PyLong_CheckExact(w)) {
            PyMem_Free(bells), PyMem_Free(fifos);
            PyErr_SetString(PyExc_ValueError, "PairLane: a bell address or world rank is impossible");
            return -1;
        }
    }
    self->wm.recycle = 1;
    if (acpy_work_maker_init(&self->wm, work_type, done_lock, home, thread_id) < 0) {
        PyMem_Free(bells), PyMem_Free(fifos);
        return -1;
    }
    PyObject *vals[] = {engine, conns, queued, posted, early, wild, probes, lost, pair_type, group_var, record,
                        status_type, dtype_code, ranks, lock, wake, wanted, put_off};
    PyObject **refs[] = PAIR_REFS(self);
    for (size_t k = 0; k < sizeof refs / sizeof refs[0]; k++)
        Py_XSETREF(*refs[k], Py_NewRef(vals[k]));
    for (int k = 0; self->fifos != NULL && k < self->size; k++) /* (init called again: a fresh cache) */
        Py_CLEAR(self->fifos[k].conn);
    PyMem_Free(self->bells), PyMem_Free(self->fifos);
    self->bells = bells, self->fifos = fifos;
    self->fd = fd, self->rank = rank, self->size = (int)n, self->yield_cpu = yield_cpu, self->enabled = 1;
    self->thread_id = thread_id, self->ctx = ctx, self->eager = eager;
    self->spin_ns = (long long)(spin_s * 1e9), self->slice_ns = (long long)(slice_s * 1e9);
    self->stall_ns = (long long)(stall_s * 1e9);
    return 0;
}

/* PairLane(setup): one typed set-up (aioccl/lanes/pair.py's PairSetup), read by name */
static int PairLane_init(PairLane *self, PyObject *args, PyObject *kwds) {
    PyObject *setup;
    if ((kwds != NULL && PyDict_GET_SIZE(kwds)) || !PyArg_ParseTuple(args, "O", &setup))
        return PyErr_Clear(), PyErr_SetString(PyExc_TypeError, "PairLane(setup): one PairSetup"), -1;
    PyObject *f[NFIELDS] = {NULL};
    int bad = 0;
    for (int k = 0; k < NFIELDS && !bad; k++)
        bad = (f[k] = field(setup, spec[k].name, spec[k].type)) == NULL;
    unsigned long long ctx = bad ? 0 : PyLong_AsUnsignedLongLong(f[CTX]);
    unsigned long thread_id = bad ? 0 : PyLong_AsUnsignedLong(f[THREAD_ID]);
    long rank_l = bad ? 0 : PyLong_AsLong(f[RANK]), fd_l = bad ? 0 : PyLong_AsLong(f[BELL_FD]);
    Py_ssize_t eager = bad ? 0 : PyLong_AsSsize_t(f[EAGER]);
    double spin_s = bad ? 0 : PyFloat_AsDouble(f[SPIN_S]), slice_s = bad ? 0 : PyFloat_AsDouble(f[SLICE_S]);
    double stall_s = bad ? 0 : PyFloat_AsDouble(f[STALL_S]);
    int yield_cpu = bad ? 0 : PyObject_IsTrue(f[YIELD_CPU]);
    if (!bad && !PyErr_Occurred() && (rank_l < INT_MIN || rank_l > INT_MAX || fd_l < INT_MIN || fd_l > INT_MAX))
        PyErr_SetString(PyExc_OverflowError, "PairLane: setup.rank or setup.bell_fd out of range");
    if (!bad && !PyErr_Occurred())
        same_key(f[KEY]);
    if (bad || PyErr_Occurred()) {
        for (int k = 0; k < NFIELDS; k++)
            Py_XDECREF(f[k]);
        return -1;
    }
    int rank = (int)rank_l, fd = (int)fd_l;
    int r = keep(self, f, ctx, thread_id, rank, yield_cpu, fd, eager, spin_s, slice_s, stall_s);
    for (int k = 0; k < NFIELDS; k++)
        Py_DECREF(f[k]);
    return r;
}

/* frames' dtype code of a descriptor (dtypes.dtype_code), cached by descriptor: 0 for none */
static long dtype_code(PairLane *self, PyArray_Descr *d) {
    int free_at = -1;
    for (int k = 0; k < DTYPE_CACHE; k++) {
        if (self->codes[k].descr == (PyObject *)d)
            return self->codes[k].code;
        if (self->codes[k].descr == NULL && free_at < 0)
            free_at = k;
    }
    PyObject *code = PyObject_CallOneArg(self->dtype_code, (PyObject *)d);
    long c = code != NULL ? PyLong_AsLong(code) : 0; /* NULL: unsupported (the general way says so) */
    Py_XDECREF(code);
    if (c <= 0 || c > 255)
        return PyErr_Clear(), 0;
    if (free_at >= 0) {
        self->codes[free_at].descr = Py_NewRef((PyObject *)d);
        self->codes[free_at].code = c;
    }
    return c;
}

/* attribute `name` of `o` is true (-1: an error) */
static int attr_true(PyObject *o, PyObject *name) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL)
        return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

/* a Python caller's arguments: 1 the lane may take the call (c filled in), 0 not (the general way), -1 an
 * error */
static int take_call(PairLane *self, PyObject *const *args, Py_ssize_t nargs, int writing, call *c) {
    if (nargs != 3 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "send(array, peer, tag[, again]) or recv(array, peer, tag[, given])");
        return -1;
    }
    c->why = ACPY_NO_OFF;
    if (!self->enabled)
        return 0;
    c->why = ACPY_NO_BUFFERS;
    if (!PyArray_CheckExact(args[0]) || !PyLong_CheckExact(args[1]) || !PyLong_CheckExact(args[2]))
        return 0;
    c->arr = (PyArrayObject *)args[0];
    c->buf = (uint8_t *)PyArray_BYTES(c->arr);
    c->want = 0, c->native = 0, c->owner = 0;
    c->peer = PyLong_AsLongLong(args[1]);
    c->tag = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred())
        return PyErr_Clear(), 0;
    if (!PyArray_IS_C_CONTIGUOUS(c->arr) || (writing && !PyArray_ISWRITEABLE(c->arr)))
        return 0;
    c->nbytes = (size_t)PyArray_NBYTES(c->arr);
    if (!(c->code = dtype_code(self, PyArray_DESCR(c->arr))))
        return 0;
    return acpy_pair_check(self, c);
}

int acpy_pair_check(PairLane *self, call *c) {
    c->why = ACPY_NO_OFF;
    if (!self->enabled)
        return 0;
    c->why = c->peer < 0 || c->tag < 0 ? ACPY_NO_WILDCARD : ACPY_NO_BUFFERS; /* (the general way names a bad peer) */
    if (c->peer < 0 || c->peer >= self->size || c->peer == self->rank || c->tag < 0 || c->tag > MAX_TAG ||
        c->code <= 0 || c->code > 255)
        return 0;
    c->why = ACPY_NO_SIZE;
    if ((Py_ssize_t)c->nbytes > self->eager)
        return 0;
    c->why = ACPY_NO_GROUP;
    int open = acpy_work_no_group(self->group_var);
    if (open <= 0)
        return open;
    c->why = ACPY_NO_OFF;
    PyObject *aborted = PyObject_GetAttr(self->engine, s_aborted);
    if (aborted == NULL)
        return -1;
    int fine = aborted == Py_None;
    Py_DECREF(aborted);
    if (!fine)
        return 0;
    c->world = PyTuple_GET_ITEM(self->ranks, c->peer);
    c->conn = PyDict_GetItemWithError(self->conns, c->world);
    if (c->conn == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if ((PyObject *)Py_TYPE(c->conn) != self->pair_type) /* (another host's peer: no FIFO between them) */
        return 0;
    int closed = attr_true(c->conn, s_closed);
    c->why = ACPY_NO_BUSY; /* (from here on, what declines is something in the way: queued, posted, held) */
    return closed < 0 ? -1 : !closed;
}

/* (size, dtype, None, None): a Work's and its flight-recorder entry's description */
static PyObject *describe(call *c) {
    PyObject *d = PyTuple_New(4), *n = PyLong_FromSsize_t(PyArray_SIZE(c->arr));
    if (d == NULL || n == NULL) {
        Py_XDECREF(d);
        Py_XDECREF(n);
        return NULL;
    }
    PyTuple_SET_ITEM(d, 0, n);
    PyTuple_SET_ITEM(d, 1, Py_NewRef((PyObject *)PyArray_DESCR(c->arr)));
    PyTuple_SET_ITEM(d, 2, Py_NewRef(Py_None));
    PyTuple_SET_ITEM(d, 3, Py_NewRef(Py_None));
    return d;
}

/* The cache entry of (peer, tag) for sends (recv 0) or receives (1): "send(peer=1, tag=3)" or "recv(...)", and
 * a receive's Status(peer, tag); formatting a name costs more than a send. NULL: an error. */
static named *op_names(PairLane *self, int recv, const call *c) {
    named *n = &self->names[recv][(uint64_t)(c->peer * 31 + c->tag) % NAME_CACHE];
    if (n->name == NULL || n->peer != c->peer || n->tag != c->tag) {
        PyObject *name = PyUnicode_FromFormat("%s(peer=%lld, tag=%lld)", recv ? "recv" : "send", c->peer, c->tag);
        PyObject *items = recv && name ? Py_BuildValue("((LL))", c->peer, c->tag) : NULL, *status = NULL;
        if (items != NULL) /* a named tuple, made as tuple.__new__ makes it (no Python __new__) */
            status = PyTuple_Type.tp_new((PyTypeObject *)self->status_type, items, NULL);
        Py_XDECREF(items);
        if (name == NULL || (recv && status == NULL)) {
            Py_XDECREF(name);
            return NULL;
        }
        Py_XSETREF(n->name, name);
        Py_XSETREF(n->status, status);
        n->peer = c->peer, n->tag = c->tag;
    }
    return n;
}

static PyObject *op_name(PairLane *self, int recv, const call *c) {
    named *n = op_names(self, recv, c);
    return n != NULL ? Py_NewRef(n->name) : NULL;
}

static PyObject *done_work(PairLane *self, PyObject *name, call *c, PyObject *result, double t0) {
    PyObject *desc = describe(c), *w = NULL;
    if (name != NULL && desc != NULL) {
        w = acpy_work_born_done(&self->wm, name, c->tag, result, desc, t0);
        if (w != NULL && acpy_work_record(self->record, name, c->tag, desc, t0) < 0)
            Py_CLEAR(w);
    }
    Py_XDECREF(desc);
    Py_XDECREF(name);
    return w;
}

int acpy_pair_put(PairLane *self, call *c) {
    /* sends to that peer put off (lanes/pair.py's put_off): this one after them, from the loop */
    PyObject *later = PyDict_GetItemWithError(self->put_off, c->world);
    int waits = later != NULL ? PyObject_IsTrue(later) : PyErr_Occurred() ? -1 : 0;
    if (waits)
        return waits < 0 ? -1 : c->owner ? 2 : 0;
    /* nothing before this frame: no send to that peer waiting in the engine, none half written, no control */
    PyObject *queued = PyDict_GetItemWithError(self->queued, c->world);
    int busy = queued != NULL ? PyObject_IsTrue(queued) : PyErr_Occurred() ? -1 : 0;
    PyObject *lock = busy == 0 ? PyObject_GetAttr(c->conn, s_lock) : NULL;
    if (busy == 0)
        busy = lock == NULL ? -1 : attr_true(lock, s_locked);
    Py_XDECREF(lock);
    if (busy == 0) {
        PyObject *control = PyObject_GetAttr(c->conn, s_control);
        busy = control == NULL ? -1 : PyObject_Length(control) != 0;
        Py_XDECREF(control);
    }
    if (busy)
        return busy < 0 ? -1 : 0;
    ac_fifo f;
    ac_fifo back;
    if (!acpy_pair_fifos(self, c, &f, &back))
        return 0;
    if (ac_fifo_free(&f) < AC_FRAME_HEADER + c->nbytes) {
        if (AC_FRAME_HEADER + c->nbytes > f.cap || self->spin_ns <= 0)
            return 0; /* longer than the FIFO (it streams through), or no waiting at all: the general way */
        int room = acpy_pair_room(self, &f, &back, c);
        if (room <= 0) /* full: on the engine's thread, again from its loop (2); elsewhere the general way */
            return room < 0 ? -1 : c->owner ? 2 : 0;
    }
    ac_frame fr = {.kind = AC_FRAME_P2P, .dtype = (uint8_t)c->code, .ctx = self->ctx, .seq = c->tag,
                   .nbytes = c->nbytes};
    uint8_t hdr[AC_FRAME_HEADER];
    if (c->nbytes >= DIRECT_MIN && acpy_pair_deliver(self, c, &f)) {
        fr.op = AC_FRAME_DELIVERED, fr.nbytes = 0, fr.count = (int64_t)c->nbytes;
        ac_frame_pack(&fr, hdr);
        ac_fifo_put_frame(&f, hdr, hdr, 0, PUBLISH_EVERY); /* (no payload: any pointer, never read) */
    } else if (ac_frame_pack(&fr, hdr), c->nbytes >= NOGIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        ac_fifo_put_frame(&f, hdr, c->buf, c->nbytes, PUBLISH_EVERY);
        Py_END_ALLOW_THREADS
    } else {
        ac_fifo_put_frame(&f, hdr, c->buf, c->nbytes, PUBLISH_EVERY);
    }
    ac_fifo_fence(); /* publish, fence, look: a peer that stopped watching reads the FIFO once more after, and
                      * one whose engine posts a receive clears quiet and then reads the FIFO (pair.py) */
    if (!ac_fifo_flag(&f, AC_FIFO_WATCHING) && !ac_fifo_flag(&f, AC_FIFO_QUIET))
        ac_bell_ring(self->fd, &self->bells[c->peer], 1, 1);
    self->sent++;
    return 1;
}

/* A Python caller's call of `verb` (acpy_pair_put or acpy_pair_get), the engine held for it (its thread, or
 * borrowed and given back, its loop woken when the verb took what the mailbox held): the verb's answer */
static int held_call(PairLane *self, PyObject *const *args, Py_ssize_t nargs, int writing, call *c,
                     int (*verb)(PairLane *, call *)) {
    int lent = 0, took = take_call(self, args, nargs, writing, c);
    if (took > 0)
        took = lent = acpy_pair_on_engine(self);
    c->owner = lent == 1;
    if (took > 0)
        took = verb(self, c);
    if (lent > 1 && acpy_pair_give_back(self, took == 3) < 0)
        took = -1;
    return took;
}

/* send(x, peer, tag[, again]): the done Work (with `again`, a put-off send tried again: True), or a Declined
 * (answers.h): Declined('full') on the engine's thread when the FIFO stayed full and its loop is wanted (the send
 * waits for room from the loop, lanes/pair.py's put_off); any other reason: the general way */
static PyObject *PairLane_send(PairLane *self, PyObject *const *args, Py_ssize_t nargs) {
    double t0 = acpy_work_monotonic();
    call c;
    int took = held_call(self, args, nargs, 0, &c, acpy_pair_put);
    if (took == 2) /* (lanes/pair.py's put_off) */
        return acpy_declined(ACPY_NO_FULL);
    if (took <= 0)
        return took < 0 ? NULL : acpy_declined((acpy_no)c.why);
    if (nargs == 4) /* a put-off send tried again: its own Work is the caller's, already recorded as it ends */
        return Py_NewRef(Py_True);
    return done_work(self, op_name(self, 0, &c), &c, Py_None, t0);
}

/* 1: the frame at the FIFO's tail is this receive's message (kind, communicator, tag, size, dtype); 2: its
 * delivered frame (the payload is in the buffer already: the receive wanted it, core/fifo.h); 0: neither */
static int mine(const PairLane *self, const call *c, const ac_frame *fr) {
    if (fr->kind != AC_FRAME_P2P || fr->ctx != self->ctx || fr->seq != c->tag)
        return 0;
    if (fr->op == AC_FRAME_DELIVERED)
        return c->want && !fr->nbytes && fr->count == (int64_t)c->nbytes && fr->dtype == c->code ? 2 : 0;
    return fr->nbytes == c->nbytes && (fr->dtype == c->code || !fr->nbytes) && fr->op == 0;
}

/* Watch the FIFO for this receive's frame for the pair's spin time (longer while it streams in), the GIL
 * released, copying what of it is published into dst as it comes (*got: how far); then stop watching and
 * look once more (a frame published meanwhile rang no bell). The frame stays in the FIFO until taken: a
 * receive that gives up leaves it whole for the general way (which writes the same bytes again). */
static int spin(PairLane *self, ac_fifo *f, const call *c, ac_frame *fr, uint8_t *dst, size_t *got, int64_t wait_ns) {
    int st;
    Py_BEGIN_ALLOW_THREADS
    /* a large message takes its sender a copy into the FIFO first: wait that long too (~4 GB/s) */
    int64_t start = acpy_pair_now_ns(), end = start + wait_ns + (int64_t)(c->nbytes / 4);
    int64_t last = start + STREAM_SPIN_NS;
    ac_fifo_set_flag(f, AC_FIFO_WATCHING, 1);
    for (;;) {
        ac_jitter();
        st = ac_fifo_peek(f, fr);
        if (st == AC_FIFO_WHOLE || st == AC_FIFO_CORRUPT || (st == AC_FIFO_PART && !mine(self, c, fr)))
            break;
        size_t before = *got;
        if (st == AC_FIFO_PART)
            *got = ac_fifo_read(f, dst, *got, c->nbytes);
        if (self->yield_cpu && *got == before)
            sched_yield();
        int64_t t = acpy_pair_now_ns();
        if (t > last || (t > end && st != AC_FIFO_PART))
            break;
    }
    ac_fifo_set_flag(f, AC_FIFO_WATCHING, 0);
    ac_fifo_fence();
    st = ac_fifo_peek(f, fr);
    Py_END_ALLOW_THREADS
    return st;
}

/* Wake this rank's own engine to read its FIFOs: a sender rings no bell while the receiver watches its FIFO
 * (spin), so what it published then behind the frame this call takes (or instead of it) would wait for the
 * next bell, as the engine's own watch avoids by reading everything once it stops (pair.py's watch). */
static void ring_own(PairLane *self) { ac_bell_ring(self->fd, &self->bells[self->rank], 1, 1); }

/* the reader is between frames (not streaming one, no header half read): 1 yes, 0 no */
static int reader_idle(PyObject *conn) {
    PyObject *reader = PyObject_GetAttr(conn, s_reader);
    if (reader == NULL)
        return -1;
    PyObject *done = PyObject_GetAttr(reader, s_done), *got = done ? PyObject_GetAttr(reader, s_got) : NULL;
    Py_DECREF(reader);
    int idle = got == NULL ? -1 : done == Py_None && PyLong_CheckExact(got) && PyLong_AsLong(got) == 0;
    Py_XDECREF(done);
    Py_XDECREF(got);
    return idle;
}

/* a receive's done Work: it gives the buffer back and says whose message it got */
static PyObject *recv_work(PairLane *self, call *c, PyObject *given, double t0) {
    named *n = op_names(self, 1, c); /* (Status is immutable: one per (peer, tag) serves every receive) */
    PyObject *w = n != NULL ? done_work(self, Py_NewRef(n->name), c, given, t0) : NULL;
    if (w != NULL)
        acpy_work_set(&self->wm, w, WORK_SLOT_STATUS, Py_NewRef(n->status));
    return w;
}

int acpy_pair_get(PairLane *self, call *c) {
    PyObject *kept = NULL;
    int took = acpy_pair_ahead(self, c, &kept);
    if (took == 2) { /* a message held for it: taken as the mailbox would, no FIFO involved */
        took = acpy_pair_take_held(self, c, kept);
        Py_DECREF(kept);
        if (took > 0)
            self->received++;
        return took > 0 ? 3 : took;
    }
    if (took > 0) {
        int paused = attr_true(c->conn, s_paused);
        took = paused < 0 ? -1 : paused ? 0 : reader_idle(c->conn);
    }
    if (took <= 0)
        return took;
    ac_fifo f;
    if (!acpy_pair_fifos(self, c, NULL, &f) || c->nbytes > f.cap - AC_FRAME_HEADER)
        return 0; /* (a message longer than the FIFO streams through) */
    /* nothing posted, no wildcard, no probe: the engine waits for no message, so the peer's lane need not
     * wake it for one (until a receive is posted: PairHub.read_left clears this, then reads the FIFO) */
    if (!PyDict_GET_SIZE(self->posted) && !PyDict_GET_SIZE(self->wild) && !PyList_GET_SIZE(self->probes) &&
        !ac_fifo_flag(&f, AC_FIFO_QUIET))
        ac_fifo_set_flag(&f, AC_FIFO_QUIET, 1);
    ac_frame fr;
    size_t got = 0;
    int st = ac_fifo_peek(&f, &fr), spun = 0, m;
    c->want = 0;
    if (st == AC_FIFO_NOT_YET && c->nbytes >= DIRECT_MIN && self->spin_ns > 0 && !c->native) { /* written here */
        c->want = __atomic_add_fetch(&wants, 1, __ATOMIC_RELAXED);
        ac_fifo_want(&f, c->want, &(ac_want){(uint64_t)(uintptr_t)c->buf, c->nbytes, self->ctx, c->tag});
    }
    if ((st == AC_FIFO_NOT_YET || (st == AC_FIFO_PART && mine(self, c, &fr))) && self->spin_ns > 0) {
        st = spin(self, &f, c, &fr, c->buf, &got, self->spin_ns);
        spun = 1;
        self->spun++;
    }
    m = st == AC_FIFO_WHOLE ? mine(self, c, &fr) : 0;
    if (c->want && ac_fifo_unwant(&f, c->want) && !m) {
        /* claimed: its sender's next frame is on its way (delivered into the buffer, or plain), however busy the
         * machine: given up, a delivered frame would reach the engine's receive instead. Only a connection that
         * ended (the sender gone) or a minute stops the wait. */
        for (int rounds = 0; !m && st != AC_FIFO_CORRUPT && rounds < 3000; rounds++) {
            int ended = attr_true(c->conn, s_closed);
            if (ended)
                break;
            st = spin(self, &f, c, &fr, c->buf, &got, STREAM_SPIN_NS);
            m = st == AC_FIFO_WHOLE ? mine(self, c, &fr) : 0;
        }
        PyErr_Clear();
    }
    if (!m) {
        /* not come within the spin: 2; another message first, a corrupt FIFO, or no spinning: 0 */
        if (spun && st != AC_FIFO_NOT_YET && st != AC_FIFO_CORRUPT)
            ring_own(self); /* another message first: published while this call watched, it rang no bell */
        return spun && (st == AC_FIFO_NOT_YET || (st == AC_FIFO_PART && mine(self, c, &fr))) ? 2 : 0;
    }
    if (m == 2) { /* delivered: the payload is in the buffer, only the header to take */
        ac_fifo_take(&f, NULL, 0);
    } else if (c->nbytes - got >= NOGIL_BYTES) { /* the rest of it (the spin copied the front as it came) */
        Py_BEGIN_ALLOW_THREADS
        ac_fifo_read(&f, c->buf, got, c->nbytes);
        ac_fifo_take(&f, NULL, c->nbytes);
        Py_END_ALLOW_THREADS
    } else {
        ac_fifo_read(&f, c->buf, got, c->nbytes);
        ac_fifo_take(&f, NULL, c->nbytes);
    }
    ac_fifo_fence(); /* freed, fence, look: a producer that waits for space wants a bell */
    if (ac_fifo_flag(&f, AC_FIFO_BLOCKED))
        ac_bell_ring(self->fd, &self->bells[c->peer], 1, 1);
    if (spun && ac_fifo_peek(&f, &fr) != AC_FIFO_NOT_YET)
        ring_own(self); /* frames behind this one, published while it watched: they rang no bell */
    self->received++;
    return 1;
}

/* recv(buf, peer, tag): the done Work, or a Declined (answers.h): Declined('spun') when this call spun and nothing
 * came (the general way, without spinning again); any other reason: the general way */
static PyObject *PairLane_recv(PairLane *self, PyObject *const *args, Py_ssize_t nargs) {
    double t0 = acpy_work_monotonic();
    call c;
    int took = held_call(self, args, nargs, 1, &c, acpy_pair_get);
    if (took == 1 || took == 3)
        return recv_work(self, &c, nargs == 4 ? args[3] : args[0], t0);
    return took < 0 ? NULL : acpy_declined(took == 2 ? ACPY_NO_SPUN : (acpy_no)c.why);
}

static PyObject *PairLane_stats(PairLane *self, PyObject *Py_UNUSED(arg)) {
    return Py_BuildValue("{sLsLsLsLsL}", "sent", self->sent, "received", self->received, "spun", self->spun,
                         "delivered", self->delivered, "full", self->full);
}

static PyMethodDef PairLane_methods[] = {
    {"send", (PyCFunction)(void (*)(void))PairLane_send, METH_FASTCALL,
     "send(x, peer, tag[, again]): the done Work of an eager send over the pair's FIFO (True with `again`: a "
     "put-off send tried again), None (the general way), or False (the FIFO stayed full and the loop is wanted: "
     "lanes/pair.py's put_off)"},
    {"recv", (PyCFunction)(void (*)(void))PairLane_recv, METH_FASTCALL,
     "recv(buf, peer, tag[, given]): the done Work (giving back `given`, by default buf) of a receive whose message is (or comes within the spin) first in the "
     "FIFO, None (the general way), or False (the general way, without spinning again)"},
    {"stats", (PyCFunction)PairLane_stats, METH_NOARGS,
     "{'sent', 'received', 'spun', 'delivered', 'full'}: calls finished in C (delivered: sends written into the "
     "receive; full: sends that found no room and went the general way)"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef PairLane_members[] = {
    {"enabled", T_INT, offsetof(PairLane, enabled), 0, "0: every call goes the general way (a closed communicator)"},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject acpy_PairLaneType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aioccl.native._core.PairLane",
    .tp_doc = "A communicator's eager point-to-point ops over shared-memory pairs, in C (see pair_lane.c)",
    .tp_basicsize = sizeof(PairLane),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)PairLane_init,
    .tp_dealloc = (destructor)PairLane_dealloc,
    .tp_traverse = (traverseproc)PairLane_traverse,
    .tp_clear = (inquiry)PairLane_clear,
    .tp_methods = PairLane_methods,
    .tp_members = PairLane_members,
};

int acpy_pair_lane_ready(PyObject *m) {
    struct { PyObject **at; const char *s; } names[] = {
        {&s_aborted, "aborted"}, {&s_closed, "closed"}, {&s_lock, "_lock"}, {&s_locked, "_locked"},
        {&s_control, "_control"}, {&s_paused, "paused"}, {&s_reader, "reader"}, {&s_done, "_done"}, {&s_got, "_got"},
    };
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if (*names[k].at == NULL && (*names[k].at = PyUnicode_InternFromString(names[k].s)) == NULL)
            return -1;
    if (acpy_pair_held_ready() < 0 || acpy_pair_fifos_ready() < 0 || acpy_pair_native_ready() < 0 ||
        PyType_Ready(&acpy_PairLaneType) < 0)
        return -1;
    return PyModule_AddObjectRef(m, "PairLane", (PyObject *)&acpy_PairLaneType);
}
