/* Program and Channel: the Python types over the channel protocol (core/channel.h).
 *
 * Program is one rank's lowered lockstep schedule, checked once when made; Channel a communicator's
 * shared-memory channel: its mapped segments and the op in progress. Channel.run and Channel.resume release
 * the GIL for the whole of the protocol: staging, waiting, reading, reducing. Results: an int >= 0 is done
 * (my new step counter); a negative one is channel.h's AC_* code. The gate's engine side (admit, finish,
 * alarm) and the doorbells rung from C (set_bells) are Channel's methods too. */
#include "channel_type.h"
#include "core/reduce.h"

#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL aioccl_native_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <sched.h>
#include <stddef.h>

/* -- Program ------------------------------------------------------------------------------------ */
static void Program_dealloc(Program *self) {
    PyMem_Free(self->words);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Program_init(Program *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"words", "rank", "size", NULL};
    Py_buffer view;
    int rank, size;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*ii", kwlist, &view, &rank, &size))
        return -1;
    if (view.len % 8) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "a native program is whole int64 words");
        return -1;
    }
    size_t len = (size_t)view.len / 8;
    int64_t *words = PyMem_Malloc(len ? len * 8 : 8);
    if (words == NULL) {
        PyBuffer_Release(&view);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(words, view.buf, len * 8);
    PyBuffer_Release(&view);
    char why[160] = "";
    if (ac_prog_check(words, len, rank, size, why, sizeof why) != 0) {
        PyMem_Free(words);
        PyErr_Format(PyExc_ValueError, "invalid native program: %s", why);
        return -1;
    }
    PyMem_Free(self->words);
    self->words = words;
    self->len = len;
    self->rank = rank;
    self->size = size;
    return 0;
}

PyTypeObject acpy_ProgramType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aioccl.native._core.Program",
    .tp_doc = "One rank's lockstep schedule, lowered to words and checked (see channel.h)",
    .tp_basicsize = sizeof(Program),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Program_init,
    .tp_dealloc = (destructor)Program_dealloc,
};

/* -- Channel ------------------------------------------------------------------------------------ */
void acpy_channel_ring_bells(Channel *chan, uint64_t mask) {
    ac_bell_ring(chan->bell_fd, chan->bells, chan->ch.size, mask);
}

static void Channel_release(Channel *self) {
    for (int k = 0; k < 3; k++)
        Py_CLEAR(self->held[k]);
    Py_CLEAR(self->pending);
    for (int j = 0; j < self->nviews; j++)
        PyBuffer_Release(&self->views[j]);
    PyMem_Free(self->views);
    self->views = NULL;
    self->nviews = 0;
    ac_chan_free(&self->ch);
    self->ch.size = 0;
    PyMem_Free(self->bells);
    self->bells = NULL;
    self->bell_fd = -1;
}

static void Channel_dealloc(Channel *self) {
    Channel_release(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Channel_init(Channel *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"segments", "rank", "spin_ns", "yield_cpu", NULL};
    PyObject *segs;
    int rank, yield_cpu;
    long long spin_ns;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OiLp", kwlist, &segs, &rank, &spin_ns, &yield_cpu))
        return -1;
    self->bell_fd = -1;  /* (PyType_GenericNew zeroes: 0 would be a real descriptor) */
    Channel_release(self);
    ac_gate_init(&self->gate, 0);
    PyObject *seq = PySequence_Fast(segs, "segments must be a sequence of writable buffers");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > AC_MAX_RANKS) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "a native channel holds 1 to %d ranks, got %zd", AC_MAX_RANKS, n);
        return -1;
    }
    self->views = PyMem_Calloc((size_t)n, sizeof(Py_buffer));
    if (self->views == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    uint8_t *bases[AC_MAX_RANKS];
    size_t lens[AC_MAX_RANKS];
    for (Py_ssize_t j = 0; j < n; j++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, j), &self->views[j], PyBUF_WRITABLE) != 0) {
            Py_DECREF(seq);
            Channel_release(self);
            return -1;
        }
        self->nviews = (int)j + 1;
        bases[j] = self->views[j].buf;
        lens[j] = (size_t)self->views[j].len;
    }
    Py_DECREF(seq);
    if (ac_chan_init(&self->ch, rank, (int)n, bases, lens, spin_ns, yield_cpu) != 0) {
        PyErr_Format(PyExc_ValueError, "cannot run a native channel here: %s", self->ch.error);
        Channel_release(self);
        return -1;
    }
    return 0;
}

static int live(Channel *self) {
    if (self->ch.size)
        return 1;
    PyErr_SetString(PyExc_ValueError, "the native channel is closed");
    return 0;
}

/* the result of run/resume as Python sees it */
static PyObject *outcome(Channel *self, int rc) {
    if (rc == AC_DONE || rc == AC_BELLS || rc == AC_NOT_CLEAN || rc == AC_MISMATCH || rc == AC_CORRUPT)
        for (int k = 0; k < 3; k++)
            Py_CLEAR(self->held[k]);
    if (rc == AC_CORRUPT)
        self->ch.active = 0;
    if (rc == AC_DONE)
        return PyLong_FromLongLong(ac_step(&self->ch));
    return PyLong_FromLong(rc);
}

static int host_array(PyObject *a, int writable, void **data, size_t *len) {
    if (!PyArray_Check(a))
        return 0;
    PyArrayObject *arr = (PyArrayObject *)a;
    if (!PyArray_IS_C_CONTIGUOUS(arr) || (writable && !PyArray_ISWRITEABLE(arr)))
        return 0;
    *data = PyArray_DATA(arr);
    *len = (size_t)PyArray_NBYTES(arr);
    return 1;
}

/* run(program, inp, out, dtype, redop, seq, order, owner): `owner` (the caller's record of the op) is kept as
 * pending when the op is left unfinished, until claim(): a signal that interrupts the caller before it has
 * handed the op on cannot lose it (the channel adopts it before its next op) */
static PyObject *Channel_run(Channel *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "run(program, inp, out, dtype, redop, seq, order, owner)");
        return NULL;
    }
    if (!live(self))
        return NULL;
    if (!PyObject_TypeCheck(args[0], &acpy_ProgramType)) {
        PyErr_SetString(PyExc_TypeError, "run: program must be a Program");
        return NULL;
    }
    Program *prog = (Program *)args[0];
    if (prog->rank != self->ch.rank || prog->size != self->ch.size) {
        PyErr_SetString(PyExc_ValueError, "run: the program was lowered for another rank or channel");
        return NULL;
    }
    if (self->ch.active) {
        PyErr_SetString(PyExc_RuntimeError, "run: another native op is in progress on this channel");
        return NULL;
    }
    void *inp, *out;
    size_t in_len, out_len;
    if (!host_array(args[1], 0, &inp, &in_len) || !host_array(args[2], 1, &out, &out_len))
        return PyLong_FromLong(AC_UNSUITABLE);
    long dtype = PyLong_AsLong(args[3]), redop = PyLong_AsLong(args[4]);
    long long seq = PyLong_AsLongLong(args[5]), order = PyLong_AsLongLong(args[6]);
    if (PyErr_Occurred())
        return NULL;
    if (dtype < 0 || dtype > AC_DT_LAST || redop < 0 || redop > AC_OP_LAST)
        return PyLong_FromLong(AC_UNSUITABLE);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ac_run(&self->ch, prog->words, prog->len, inp, in_len, out, out_len, (int)dtype, (int)redop, seq, order);
    Py_END_ALLOW_THREADS
    if (rc == AC_BLOCKED) {  /* it goes on later: keep what it reads and writes alive */
        for (int k = 0; k < 3; k++)
            Py_XSETREF(self->held[k], Py_NewRef(args[k]));
    }
    self->last = rc;
    if (rc != AC_DONE && rc != AC_BELLS && rc != AC_UNSUITABLE)
        Py_XSETREF(self->pending, Py_NewRef(args[7]));
    return outcome(self, rc);
}

/* resume([slice_until_ns]): see ac_resume_until */
static PyObject *Channel_resume(Channel *self, PyObject *const *args, Py_ssize_t nargs) {
    long long until = 0;
    if (nargs > 1 || (nargs == 1 && (until = PyLong_AsLongLong(args[0])) == -1 && PyErr_Occurred())) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "resume([slice_until_ns])");
        return NULL;
    }
    if (!live(self))
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ac_resume_until(&self->ch, (int64_t)until);
    Py_END_ALLOW_THREADS
    return outcome(self, rc);
}

static PyObject *Channel_reset(Channel *self, PyObject *Py_UNUSED(ignored)) {
    ac_reset(&self->ch);
    for (int k = 0; k < 3; k++)
        Py_CLEAR(self->held[k]);
    Py_RETURN_NONE;
}

static PyObject *Channel_close(Channel *self, PyObject *Py_UNUSED(ignored)) {
    ac_gate_alarm(&self->gate);  /* no more claims; an XLA call inside finishes or hands over within its spin */
    Py_BEGIN_ALLOW_THREADS
    while (ac_gate_busy(&self->gate))
        sched_yield();
    Py_END_ALLOW_THREADS
    Channel_release(self);
    Py_RETURN_NONE;
}

/* -- the gate, from the engine's side (gate.h) -------------------------------------------------------- */
static PyObject *Channel_admit(Channel *self, PyObject *order) {
    long long o = PyLong_AsLongLong(order);
    if (o == -1 && PyErr_Occurred())
        return NULL;
    return PyBool_FromLong(ac_gate_admit(&self->gate, o));
}

static PyObject *Channel_finish(Channel *self, PyObject *Py_UNUSED(ignored)) {
    ac_gate_finish(&self->gate);
    Py_RETURN_NONE;
}

static PyObject *Channel_alarm(Channel *self, PyObject *Py_UNUSED(ignored)) {
    ac_gate_alarm(&self->gate);
    Py_RETURN_NONE;
}

/* set_bells(fd, addresses): the socket to ring from and each channel rank's doorbell address */
static PyObject *Channel_set_bells(Channel *self, PyObject *args) {
    int fd;
    PyObject *addrs;
    if (!PyArg_ParseTuple(args, "iO!", &fd, &PyList_Type, &addrs))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(addrs);
    if (n != self->ch.size) {
        PyErr_SetString(PyExc_ValueError, "set_bells: one address per channel rank");
        return NULL;
    }
    ac_bell *bells = PyMem_Calloc((size_t)n, sizeof *bells);
    if (bells == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t j = 0; j < n; j++) {
        char *buf;
        Py_ssize_t len;
        if (PyBytes_AsStringAndSize(PyList_GET_ITEM(addrs, j), &buf, &len) < 0 ||
            ac_bell_set(&bells[j], buf, (size_t)len) < 0) {
            PyMem_Free(bells);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "set_bells: an address too long for a unix socket");
            return NULL;
        }
    }
    PyMem_Free(self->bells);
    self->bells = bells;
    self->bell_fd = fd;
    Py_RETURN_NONE;
}

/* set_cma(min_bytes): peers read my buffers of at least min_bytes in place, and I theirs (0: never); only
 * once every rank of the channel proved it may (engine/shm/setup.py) */
static PyObject *Channel_set_cma(Channel *self, PyObject *arg) {
    long long min_bytes = PyLong_AsLongLong(arg);
    if (min_bytes == -1 && PyErr_Occurred())
        return NULL;
    if (min_bytes < 0) {
        PyErr_SetString(PyExc_ValueError, "set_cma: a negative size");
        return NULL;
    }
    if (ac_chan_cma(&self->ch, (size_t)min_bytes) != 0) {
        PyErr_Format(PyExc_ValueError, "cannot read peers in place: %s", self->ch.error);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* set_slice(ns): a call runs steps for at most this long before it returns, blocked in phase 3 (0: never) */
static PyObject *Channel_set_slice(Channel *self, PyObject *arg) {
    long long ns = PyLong_AsLongLong(arg);
    if (ns == -1 && PyErr_Occurred())
        return NULL;
    ac_chan_slice(&self->ch, ns);
    Py_RETURN_NONE;
}

static PyObject *Channel_claim(Channel *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *p = self->pending ? self->pending : Py_NewRef(Py_None);
    self->pending = NULL;
    return p;
}

static PyObject *Channel_take_bells(Channel *self, PyObject *Py_UNUSED(ignored)) {
    uint64_t bells = self->ch.bells;
    self->ch.bells = 0;
    return PyLong_FromUnsignedLongLong(bells);
}

static PyObject *Channel_descriptors(Channel *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *out = PyList_New(self->ch.size);
    if (out == NULL)
        return NULL;
    for (int j = 0; j < self->ch.size; j++) {
        const int64_t *d = self->ch.descs[j];
        PyObject *t = Py_BuildValue("(LLLLLLLL)", d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]);
        if (t == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, j, t);
    }
    return out;
}

static PyObject *Channel_get_step(Channel *self, void *Py_UNUSED(c)) {
    return live(self) ? PyLong_FromLongLong(ac_step(&self->ch)) : NULL;
}
static PyObject *Channel_get_blocked(Channel *self, void *Py_UNUSED(c)) {
    return Py_BuildValue("(iL)", self->ch.blocked_phase, (long long)self->ch.blocked_s);
}
static PyObject *Channel_get_where(Channel *self, void *Py_UNUSED(c)) {
    return Py_BuildValue("(LL)", (long long)self->ch.step_index, (long long)self->ch.base);
}
static PyObject *Channel_get_pending(Channel *self, void *Py_UNUSED(c)) {
    return PyBool_FromLong(self->pending != NULL);
}
static PyObject *Channel_get_next_order(Channel *self, void *Py_UNUSED(c)) {
    return PyLong_FromLongLong(ac_gate_next(&self->gate));
}
static int Channel_set_next_order(Channel *self, PyObject *v, void *Py_UNUSED(c)) {
    long long n = v ? PyLong_AsLongLong(v) : -1;
    if (n == -1 && PyErr_Occurred())
        return -1;
    ac_gate_set_next(&self->gate, n);
    return 0;
}
static PyObject *Channel_get_busy(Channel *self, void *Py_UNUSED(c)) { return PyBool_FromLong(ac_gate_busy(&self->gate)); }
static PyObject *Channel_get_last(Channel *self, void *Py_UNUSED(c)) { return PyLong_FromLong(self->last); }
static PyObject *Channel_get_peer(Channel *self, void *Py_UNUSED(c)) { return PyLong_FromLong(self->ch.peer); }
static PyObject *Channel_get_error(Channel *self, void *Py_UNUSED(c)) {
    return PyUnicode_FromString(self->ch.error);
}
static PyObject *Channel_get_stats(Channel *self, void *Py_UNUSED(c)) {
    return Py_BuildValue("{sKsKsKsK}", "ops", (unsigned long long)self->ch.ops, "spin_hits",
                         (unsigned long long)self->ch.spin_hits, "cma_reads", (unsigned long long)self->ch.cma_reads,
                         "cma_writes", (unsigned long long)self->ch.cma_writes);
}

static PyMethodDef Channel_methods[] = {
    {"run", (PyCFunction)(void (*)(void))Channel_run, METH_FASTCALL,
     "run(program, inp, out, dtype, redop, seq, order): start an op; >= 0 done (my step), < 0 a code"},
    {"resume", (PyCFunction)(void (*)(void))Channel_resume, METH_FASTCALL,
     "resume([slice_until_ns]): go on with a blocked op, as run (its slice ending then: the loop's turn)"},
    {"reset", (PyCFunction)Channel_reset, METH_NOARGS, "forget the op in progress"},
    {"close", (PyCFunction)Channel_close, METH_NOARGS, "release the segments' buffers"},
    {"claim", (PyCFunction)Channel_claim, METH_NOARGS, "the owner of an op run() left unfinished, or None; cleared"},
    {"take_bells", (PyCFunction)Channel_take_bells, METH_NOARGS, "channel ranks to ring (a bit mask), cleared"},
    {"descriptors", (PyCFunction)Channel_descriptors, METH_NOARGS, "every rank's descriptor of the op"},
    {"admit", (PyCFunction)Channel_admit, METH_O, "admit(order): may the engine run that op now (else it holds it)"},
    {"finish", (PyCFunction)Channel_finish, METH_NOARGS, "an op the engine admitted has ended"},
    {"alarm", (PyCFunction)Channel_alarm, METH_NOARGS, "broken or closing: no native caller may claim it again"},
    {"set_bells", (PyCFunction)Channel_set_bells, METH_VARARGS, "set_bells(fd, addresses): ring from C"},
    {"set_cma", (PyCFunction)Channel_set_cma, METH_O, "set_cma(min_bytes): read buffers in place (0: never)"},
    {"set_slice", (PyCFunction)Channel_set_slice, METH_O, "set_slice(ns): a call runs steps this long at most"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Channel_getset[] = {
    {"step", (getter)Channel_get_step, NULL, "my step counter", NULL},
    {"blocked", (getter)Channel_get_blocked, NULL, "(phase, step) a blocked op waits for", NULL},
    {"where", (getter)Channel_get_where, NULL, "(step index, base step) of the op in progress", NULL},
    {"pending", (getter)Channel_get_pending, NULL, "whether an unfinished op waits to be claimed", NULL},
    {"next_order", (getter)Channel_get_next_order, (setter)Channel_set_next_order,
     "the order number of the op the channel runs next", NULL},
    {"busy", (getter)Channel_get_busy, NULL, "whether a native caller holds the channel now", NULL},
    {"last", (getter)Channel_get_last, NULL, "what the last run() returned", NULL},
    {"peer", (getter)Channel_get_peer, NULL, "the rank whose descriptor differs (a mismatch)", NULL},
    {"error", (getter)Channel_get_error, NULL, "what was wrong (a corrupt peer)", NULL},
    {"stats", (getter)Channel_get_stats, NULL, "ops run and waits ended by spinning", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject acpy_ChannelType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aioccl.native._core.Channel",
    .tp_doc = "A shared-memory channel's native protocol (see channel.h)",
    .tp_basicsize = sizeof(Channel),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Channel_init,
    .tp_dealloc = (destructor)Channel_dealloc,
    .tp_methods = Channel_methods,
    .tp_getset = Channel_getset,
};

int acpy_channel_type_ready(PyObject *m) {
    if (PyType_Ready(&acpy_ProgramType) < 0 || PyType_Ready(&acpy_ChannelType) < 0)
        return -1;
    if (PyModule_AddObjectRef(m, "Program", (PyObject *)&acpy_ProgramType) < 0 ||
        PyModule_AddObjectRef(m, "Channel", (PyObject *)&acpy_ChannelType) < 0)
        return -1;
    return 0;
}
