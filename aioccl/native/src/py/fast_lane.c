/* The fast lane: comm.all_reduce(x) on a same-host communicator, from the call to the done Work, in C.
 *
 * Lane.all_reduce takes the common case only (an aligned, contiguous, writable numpy array of a
 * supported dtype, in place, a known reduction, nothing queued on the channel, no group open, the
 * engine's thread or an idle borrowed engine) and declines anything else (a Declined naming why, answers.h),
 * before taking a sequence number, so the caller goes the general way. It takes the op's sequence number and channel
 * order (the Lane owns the communicator's counters), runs the protocol with the GIL released, and
 * returns the done Work with its flight-recorder entry made. An op that must wait longer than a spin
 * comes back as a Handover for the engine to carry on with (aioccl/engine/shm/native.py). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <sched.h>
#include <time.h>
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL aioccl_native_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include "core/jitter.h"
#include "answers.h"
#include "fast_lane.h"
#include "lane.h"
#include "core/reduce.h"

static PyObject *s_acquire, *s_release, *s_sum, *s_prod, *s_min, *s_max, *s_avg, *s_torch, *s_Tensor, *s_is_cuda,
    *s_numpy, *s_ml_dtypes, *s_bfloat16;

static void Lane_clear_cache(Lane *self) {
    for (int k = 0; k < CACHE; k++) {
        Py_CLEAR(self->cache[k].prog);
        self->cache[k].count = -1;
    }
    acpy_calls_clear(self->calls);
}

/* the lane and its communicator hold each other (through record, ring_bells): the cycle collector must see the
 * lane's references */
#define LANE_REFS(self) {&(self)->lock, &(self)->group_var, &(self)->record, &(self)->ring_bells, &(self)->name, \
    &(self)->pending, (PyObject **)&(self)->chan}

static int Lane_traverse(Lane *self, visitproc visit, void *arg) {
    PyObject **refs[] = LANE_REFS(self);
    for (size_t k = 0; k < sizeof refs / sizeof refs[0]; k++)
        Py_VISIT(*refs[k]);
    for (int k = 0; k <= AC_OP_LAST; k++)
        Py_VISIT(self->ops[k]);
    for (int k = 0; k < CACHE; k++)
        Py_VISIT(self->cache[k].prog);
    int r = acpy_calls_traverse(self->calls, visit, arg);
    return r ? r : acpy_work_maker_traverse(&self->wm, visit, arg);
}

static int Lane_clear(Lane *self) {
    Lane_clear_cache(self);
    PyObject **refs[] = LANE_REFS(self);
    for (size_t k = 0; k < sizeof refs / sizeof refs[0]; k++)
        Py_CLEAR(*refs[k]);
    for (int k = 0; k <= AC_OP_LAST; k++)
        Py_CLEAR(self->ops[k]);
    acpy_work_maker_clear(&self->wm);
    self->enabled = 0;
    return 0;
}

static void Lane_dealloc(Lane *self) {
    PyObject_GC_UnTrack(self);
    Lane_clear(self);
    acpy_calls_free(self->calls);
    self->calls = NULL;
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Lane(channel, work_type, done_lock, home, thread_id, lock, group_var, record, ring_bells, ops,
 *      bf16_num, max_bytes, seq, order) */
static int Lane_init(Lane *self, PyObject *args, PyObject *Py_UNUSED(kwds)) {
    PyObject *chan, *work_type, *done_lock, *home, *lock, *group_var, *record, *ring_bells, *ops;
    unsigned long thread_id;
    int bf16_num;
    Py_ssize_t max_bytes;
    long long seq, order;
    if (!PyArg_ParseTuple(args, "OO!OOkOOOOO!inLL", &chan, &PyType_Type, &work_type,
                          &done_lock, &home, &thread_id, &lock, &group_var, &record, &ring_bells, &PyTuple_Type, &ops,
                          &bf16_num, &max_bytes, &seq, &order))
        return -1;
    if (chan != Py_None && !PyObject_TypeCheck(chan, &acpy_ChannelType)) {
        PyErr_SetString(PyExc_TypeError, "Lane: channel must be a Channel, or None for a communicator of one rank");
        return -1;
    }
    if (PyTuple_GET_SIZE(ops) != AC_OP_LAST) {
        PyErr_SetString(PyExc_ValueError, "Lane: ops must hold the 5 ReduceOp members in code order");
        return -1;
    }
    self->wm.recycle = 1;
    if (acpy_work_maker_init(&self->wm, work_type, done_lock, home, thread_id) < 0)
        return -1;
    if (self->calls == NULL && (self->calls = acpy_calls_new()) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_XSETREF(self->chan, chan == Py_None ? NULL : (Channel *)Py_NewRef(chan));
    Py_XSETREF(self->lock, Py_NewRef(lock));
    Py_XSETREF(self->group_var, Py_NewRef(group_var));
    Py_XSETREF(self->record, Py_NewRef(record));
    Py_XSETREF(self->ring_bells, Py_NewRef(ring_bells));
    Py_XSETREF(self->name, PyUnicode_InternFromString("all_reduce"));
    for (int k = 1; k <= AC_OP_LAST; k++)
        Py_XSETREF(self->ops[k], Py_NewRef(PyTuple_GET_ITEM(ops, k - 1)));
    self->thread_id = thread_id;
    self->bf16_num = bf16_num;
    self->max_bytes = max_bytes;
    self->seq = seq;
    if (self->chan != NULL)
        ac_gate_init(&self->chan->gate, order);  /* a new channel: every op so far was off it */
    self->enabled = 1;
    Lane_clear_cache(self);
    return self->name == NULL ? -1 : 0;
}

/* -- the counters: every op of the communicator takes its numbers here -------------------------- */
static PyObject *Lane_take(Lane *self, PyObject *on_channel) {
    if (PyObject_IsTrue(on_channel) && self->chan == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "take: this lane has no channel");
        return NULL;
    }
    long long seq = __atomic_fetch_add(&self->seq, 1, __ATOMIC_RELAXED), order = -1;
    if (PyObject_IsTrue(on_channel))
        order = ac_gate_take(&self->chan->gate);
    return Py_BuildValue("(LL)", seq, order);
}

static PyObject *Lane_learn(Lane *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyObject_TypeCheck(args[2], &acpy_ProgramType)) {
        PyErr_SetString(PyExc_TypeError, "learn(count, dtype, program)");
        return NULL;
    }
    long long count = PyLong_AsLongLong(args[0]);
    long dtype = PyLong_AsLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    cached *c = &self->cache[(uint64_t)(count * 31 + dtype) % CACHE];
    c->count = count;
    c->dtype = (int)dtype;
    Py_XSETREF(c->prog, Py_NewRef(args[2]));
    Py_RETURN_NONE;
}

/* -- the fast path ------------------------------------------------------------------------------ */
/* bfloat16's type number, from ml_dtypes if it is imported (nothing is imported here): the lane is made
 * before the app may import ml_dtypes (aioccl imports it only on first use, aioccl/dtypes.py), and no array
 * can be bfloat16 before it is, so the number is looked up the first time a user-defined dtype is met. */
static void learn_bf16(Lane *self) {
    PyObject *ml = PyImport_GetModule(s_ml_dtypes);
    if (ml == NULL) {
        PyErr_Clear();
        return;
    }
    PyObject *type = PyObject_GetAttr(ml, s_bfloat16);
    Py_DECREF(ml);
    PyArray_Descr *bf = type != NULL ? PyArray_DescrFromTypeObject(type) : NULL;
    Py_XDECREF(type);
    if (bf == NULL) {
        PyErr_Clear();
        return;
    }
    self->bf16_num = bf->type_num;
    Py_DECREF(bf);
}

int acpy_lane_dtype(Lane *self, PyObject *descr) {
    PyArray_Descr *d = (PyArray_Descr *)descr;
    npy_intp size = PyDataType_ELSIZE(d);
    if (!PyArray_ISNBO(d->byteorder))
        return 0;
    if (self->bf16_num < 0 && d->type_num >= NPY_USERDEF)
        learn_bf16(self);
    if (d->type_num == self->bf16_num)
        return AC_DT_BF16;
    switch (d->kind) {
    case 'i': return size == 1 ? AC_DT_I8 : size == 4 ? AC_DT_I32 : size == 8 ? AC_DT_I64 : 0;
    case 'u': return size == 1 ? AC_DT_U8 : size == 4 ? AC_DT_U32 : size == 8 ? AC_DT_U64 : 0;
    case 'f': return size == 2 ? AC_DT_F16 : size == 4 ? AC_DT_F32 : size == 8 ? AC_DT_F64 : 0;
    default: return 0;
    }
}

int acpy_lane_redop(Lane *self, PyObject *op) {
    if (op == NULL)
        return AC_OP_SUM;
    for (int k = 1; k <= AC_OP_LAST; k++)
        if (op == self->ops[k])
            return k;
    if (!PyUnicode_CheckExact(op))
        return 0;
    PyObject *names[] = {NULL, s_sum, s_prod, s_min, s_max, s_avg};
    for (int k = 1; k <= AC_OP_LAST; k++)
        if (op == names[k] || PyUnicode_Compare(op, names[k]) == 0)
            return k;
    PyErr_Clear();
    return 0;
}

static int lock_call(PyObject *lock, PyObject *method, PyObject *arg) {
    PyObject *r = arg ? PyObject_CallMethodOneArg(lock, method, arg) : PyObject_CallMethodNoArgs(lock, method);
    if (r == NULL)
        return -1;
    int yes = PyObject_IsTrue(r);
    Py_DECREF(r);
    return yes;
}

static PyObject *record_done(Lane *self, PyArrayObject *x, PyObject *give, long long seq, Py_ssize_t count,
                             int redop, double t0) {
    PyObject *desc = Py_BuildValue("(nOOO)", count, (PyObject *)PyArray_DESCR(x), self->ops[redop], Py_None);
    if (desc == NULL)
        return NULL;
    PyObject *result = acpy_work_born_done(&self->wm, self->name, seq, give, desc, t0);
    if (result != NULL && acpy_work_record(self->record, self->name, seq, desc, t0) < 0)
        Py_CLEAR(result);
    Py_DECREF(desc);
    return result;
}

static PyObject *alone(Lane *self, PyArrayObject *x, PyObject *give, Py_ssize_t count, int redop) {
    int open = acpy_work_no_group(self->group_var);
    if (open <= 0)
        return open < 0 ? NULL : acpy_declined(ACPY_NO_GROUP);
    return record_done(self, x, give, __atomic_fetch_add(&self->seq, 1, __ATOMIC_RELAXED), count, redop, acpy_work_monotonic());
}

/* all_reduce(x[, op[, given]]): in place, from the call to the done Work; a Declined (answers.h) before any number
 * is taken; or a Handover the engine carries on */
static PyObject *Lane_all_reduce(Lane *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (!__atomic_load_n(&self->enabled, __ATOMIC_ACQUIRE))
        return acpy_declined(ACPY_NO_OFF);
    if (acpy_lane_learning) /* jax_ext learning what an op runs: the general way must build it */
        return acpy_declined(ACPY_NO_LEARNING);
    if (kwnames != NULL || nargs < 1 || nargs > 3 || !PyArray_CheckExact(args[0]))
        return acpy_declined(ACPY_NO_BUFFERS);
    PyObject *give = nargs == 3 ? args[2] : args[0];  /* what the Work gives back: x, or the tensor it views */
    PyArrayObject *x = (PyArrayObject *)args[0];
    if (!PyArray_CHKFLAGS(x, NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_WRITEABLE | NPY_ARRAY_ALIGNED))
        return acpy_declined(ACPY_NO_BUFFERS);
    int dtype = acpy_lane_dtype(self, (PyObject *)PyArray_DESCR(x)), redop = acpy_lane_redop(self, nargs >= 2 ? args[1] : NULL);
    if (!dtype || !redop || (redop == AC_OP_AVG && dtype != AC_DT_F16 && dtype != AC_DT_BF16 && dtype != AC_DT_F32 && dtype != AC_DT_F64))
        return acpy_declined(ACPY_NO_BUFFERS);
    Py_ssize_t nbytes = PyArray_NBYTES(x), count = PyArray_SIZE(x);
    if (self->chan == NULL && nbytes > 0)  /* one rank: the reduction of x alone is x, in place (an average too) */
        return alone(self, x, give, count, redop);
    if (nbytes <= 0 || nbytes > self->max_bytes || self->chan == NULL)
        return acpy_declined(ACPY_NO_SIZE);
    cached *c = &self->cache[(uint64_t)(count * 31 + dtype) % CACHE];
    if (c->prog == NULL || c->count != count || c->dtype != dtype)  /* (the general way's plan teaches it: learn) */
        return acpy_declined(ACPY_NO_FORM);
    Program *prog = (Program *)c->prog;
    ac_chan *ch = &self->chan->ch;
    if ((uint64_t)prog->words[8] * (uint64_t)ac_itemsize(dtype) > (uint64_t)nbytes ||
        (uint64_t)prog->words[9] * (uint64_t)ac_itemsize(dtype) > (uint64_t)nbytes)
        return acpy_declined(ACPY_NO_SIZE);
    if (!ch->size || ch->active)
        return acpy_declined(ACPY_NO_BUSY);
    int open = acpy_work_no_group(self->group_var);
    if (open <= 0)
        return open < 0 ? NULL : acpy_declined(ACPY_NO_GROUP);
    long long seq;
    int64_t order;
    int rc;
    double t0;
    void *data = PyArray_DATA(x);
    int went = acpy_lane_go(self, (PyObject *)prog, data, (size_t)nbytes, data, (size_t)nbytes, dtype, redop,
                            (PyObject *)x, (PyObject *)x, &seq, &order, &rc, &t0);
    if (went <= 0)
        return went < 0 ? NULL : acpy_declined(ACPY_NO_BUSY);
    if (went == 2) {
        /* the engine carries on with it (and submits it, in order); kept here until the caller claims it,
         * so a signal that interrupts the caller before then cannot lose the op (it is adopted instead) */
        PyObject *op = nargs >= 2 ? args[1] : s_sum;
        Py_XSETREF(self->pending, acpy_handover(Py_None, (PyObject *)x, (PyObject *)x, op, rc, seq, (long long)order,
                                                give));
        return self->pending ? Py_NewRef(self->pending) : NULL;
    }
    return record_done(self, x, give, seq, count, redop, t0);
}

static PyObject *tensor_type; /* torch.Tensor, once torch is imported */

/* A dense CPU torch tensor's numpy view (a new reference), as aioccl/lanes/call.py's host_view gives it; NULL,
 * with no error set, for anything else (torch not imported, a CUDA tensor, one numpy() refuses: bfloat16,
 * grad, sparse). A CUDA tensor is asked is_cuda first: its numpy() refuses only after ~10 us. */
static PyObject *tensor_view(PyObject *x) {
    if (tensor_type == NULL) {
        PyObject *torch = PyImport_GetModule(s_torch);
        PyObject *t = torch != NULL ? PyObject_GetAttr(torch, s_Tensor) : NULL;
        Py_XDECREF(torch);
        if (t == NULL || !PyType_Check(t)) {
            Py_XDECREF(t);
            PyErr_Clear();
            return NULL;
        }
        tensor_type = t;
    }
    if (!PyObject_TypeCheck(x, (PyTypeObject *)tensor_type))
        return NULL;
    PyObject *cuda = PyObject_GetAttr(x, s_is_cuda);
    int on_gpu = cuda != NULL ? PyObject_IsTrue(cuda) : -1;
    Py_XDECREF(cuda);
    PyObject *view = on_gpu == 0 ? PyObject_CallMethodNoArgs(x, s_numpy) : NULL;
    if (view != NULL && !PyArray_CheckExact(view))
        Py_CLEAR(view);
    if (view == NULL)
        PyErr_Clear();
    return view;
}

/* call(code, x, out, op, root): the door's first try, on the caller's own arguments before any record is made
 * (aioccl/lanes/door.py): an in-place all_reduce takes all_reduce's path (a CPU tensor through its numpy view:
 * torch.distributed's own call), any other call run()'s */
static PyObject *Lane_call(Lane *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "call(code, x, out, op, root)");
        return NULL;
    }
    long code = PyLong_CheckExact(args[0]) ? PyLong_AsLong(args[0]) : -1;
    if (code == -1 && PyErr_Occurred())
        PyErr_Clear(); /* (run() declines it) */
    if (args[2] == Py_None && code == ACPY_CODE_ALL_REDUCE) {
        if (PyArray_CheckExact(args[1]) || !__atomic_load_n(&self->enabled, __ATOMIC_ACQUIRE)) {
            PyObject *xo[2] = {args[1], args[3]};
            return Lane_all_reduce(self, xo, 2, NULL);
        }
        PyObject *view = tensor_view(args[1]);
        if (view == NULL)
            return acpy_declined(ACPY_NO_BUFFERS);
        PyObject *xo[3] = {view, args[3], args[1]}; /* (the Work gives back the tensor) */
        PyObject *got = Lane_all_reduce(self, xo, 3, NULL);
        Py_DECREF(view);
        return got;
    }
    return acpy_lane_run(self, args, 5);
}

static int go_locked(Lane *self, PyObject *prog, void *in, size_t in_len, void *out, size_t out_len, int dtype,
                     int redop, PyObject *hold_in, PyObject *hold_out, long long *seq, int64_t *order, int *rc,
                     double *t0) {
    if (self->pending != NULL)
        return 0;
    /* The gate alone says whether the channel is free, without a look at the engine's Python state: every op
     * the engine queues is admitted through it (engine_ops counts it until it finishes, and a held op's
     * number is not yet next), and a broken or closing channel raised its alarm (engine/shm/order.py) */
    if (!ac_gate_claim(&self->chan->gate, order))  /* an XLA call runs, or the engine has ops: go its way */
        return 0;
    ac_chan *ch = &self->chan->ch;
    Program *p = (Program *)prog;
    *seq = __atomic_fetch_add(&self->seq, 1, __ATOMIC_RELAXED);
    *t0 = acpy_work_monotonic();
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = ac_run(ch, p->words, p->len, in, in_len, out, out_len, dtype, redop, *seq, *order);
    Py_END_ALLOW_THREADS
    *rc = r;
    if (r == AC_BLOCKED) {
        PyObject *held[3] = {prog, hold_in, hold_out};
        for (int k = 0; k < 3; k++)
            Py_XSETREF(self->chan->held[k], Py_NewRef(held[k]));
    }
    if (r != AC_DONE && r != AC_BELLS) {
        ac_gate_drop(&self->chan->gate);  /* the engine admits it in order (its number is next) */
        return 2;
    }
    if (r == AC_BELLS) {
        PyObject *mask = PyLong_FromUnsignedLongLong(ch->bells);
        ch->bells = 0;
        PyObject *res = mask ? PyObject_CallOneArg(self->ring_bells, mask) : NULL;
        Py_XDECREF(mask);
        if (res == NULL)
            return -1;
        Py_DECREF(res);
    }
    if (ac_gate_done(&self->chan->gate, *order))  /* the engine holds an op that waited: wake it */
        acpy_channel_ring_bells(self->chan, (uint64_t)1 << ch->rank);
    return 1;
}

int acpy_lane_go(Lane *self, PyObject *prog, void *in, size_t in_len, void *out, size_t out_len, int dtype,
                 int redop, PyObject *hold_in, PyObject *hold_out, long long *seq, int64_t *order, int *rc,
                 double *t0) {
    ac_chan *ch = &self->chan->ch;
    if (!ch->size || ch->active)
        return 0;
    if (PyThread_get_thread_ident() == self->thread_id)
        return go_locked(self, prog, in, in_len, out, out_len, dtype, redop, hold_in, hold_out, seq, order, rc, t0);
    if (self->lock == Py_None)  /* another thread, and an engine that lends nothing */
        return 0;
    int got = lock_call(self->lock, s_acquire, Py_False);
    if (got <= 0)
        return got;
    int went = go_locked(self, prog, in, in_len, out, out_len, dtype, redop, hold_in, hold_out, seq, order, rc, t0);
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *exc = PyErr_GetRaisedException();
#else
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
#endif
    if (lock_call(self->lock, s_release, NULL) < 0)
        went = -1;
#if PY_VERSION_HEX >= 0x030C0000
    if (exc != NULL)
        PyErr_SetRaisedException(exc);
#else
    if (type != NULL)
        PyErr_Restore(type, exc, tb);
#endif
    return went;
}

_Thread_local int acpy_lane_busy;

int acpy_lane_run_native(PyObject *obj, const Program *prog, void *in, size_t in_len, void *out, size_t out_len,
                    int dtype, int redop, int64_t *seq, int64_t *order) {
    Lane *self = (Lane *)obj;
    acpy_lane_busy = 0;
    if (!__atomic_load_n(&self->enabled, __ATOMIC_ACQUIRE))
        return ACPY_LANE_NOT_NOW;
    if (self->chan == NULL)
        return ACPY_LANE_NOT_NOW;
    if (prog->rank != self->chan->ch.rank || prog->size != self->chan->ch.size)
        return ACPY_LANE_NOT_NOW;
    if (!ac_gate_claim(&self->chan->gate, order)) {
        acpy_lane_busy = 1; /* the engine's ops, or another native caller's, hold the channel */
        return ACPY_LANE_NOT_NOW;
    }
    ac_chan *ch = &self->chan->ch;
    *seq = __atomic_fetch_add(&self->seq, 1, __ATOMIC_RELAXED);
    if (!ch->size || ch->active) {  /* (the gate rules this out) the numbers are taken: the engine runs it */
        ac_gate_drop(&self->chan->gate);
        return AC_UNSUITABLE;
    }
    int rc = ac_run(ch, prog->words, prog->len, in, in_len, out, out_len, dtype, redop, *seq, *order);
    /* The caller's thread (XLA's) waits for the op anyway: go on waiting here, yielding the CPU, rather than
     * hand a late peer's op to the engine at once (a hand-off costs ~100 us); the engine takes over after
     * NATIVE_WAIT_S, or at once when it raised the alarm, and owns deadlines and failures from there. */
    double until = rc == AC_BLOCKED ? acpy_work_monotonic() + NATIVE_WAIT_S : 0.0;
    while (rc == AC_BLOCKED && acpy_work_monotonic() < until && !ac_gate_alarmed(&self->chan->gate) &&
           __atomic_load_n(&self->enabled, __ATOMIC_ACQUIRE)) {
        sched_yield();
        ac_jitter();
        rc = ac_resume(ch);
    }
    if (rc == AC_UNSUITABLE) {  /* nothing was published: the engine runs it */
        ac_gate_drop(&self->chan->gate);
        return rc;
    }
    if (rc == AC_DONE || rc == AC_BELLS) {
        uint64_t bells = rc == AC_BELLS ? ch->bells : 0;
        ch->bells = 0;
        if (ac_gate_done(&self->chan->gate, *order))
            bells |= (uint64_t)1 << ch->rank;
        acpy_channel_ring_bells(self->chan, bells);
        return AC_DONE;
    }
    ac_gate_drop(&self->chan->gate);
    return rc;
}

int acpy_lane_alone(PyObject *obj, int64_t *seq) {
    Lane *self = (Lane *)obj;
    if (self->chan != NULL || !__atomic_load_n(&self->enabled, __ATOMIC_ACQUIRE))
        return 0;
    *seq = __atomic_fetch_add(&self->seq, 1, __ATOMIC_RELAXED);
    return 1;
}

static PyObject *Lane_get_seq(Lane *self, void *Py_UNUSED(c)) {
    return PyLong_FromLongLong(__atomic_load_n(&self->seq, __ATOMIC_RELAXED));
}
static PyObject *Lane_get_order(Lane *self, void *Py_UNUSED(c)) {
    return PyLong_FromLongLong(self->chan ? self->chan->gate.order : -1);
}
static PyObject *Lane_get_enabled(Lane *self, void *Py_UNUSED(c)) { return PyBool_FromLong(self->enabled); }
static PyObject *Lane_get_ran(Lane *self, void *Py_UNUSED(c)) { return PyLong_FromLongLong(self->ran); }
static int Lane_set_enabled(Lane *self, PyObject *v, void *Py_UNUSED(c)) {
    int yes = v ? PyObject_IsTrue(v) : 0;
    if (yes < 0)
        return -1;
    __atomic_store_n(&self->enabled, yes, __ATOMIC_RELEASE);
    return 0;
}
static PyObject *Lane_claim(Lane *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *p = self->pending ? self->pending : Py_NewRef(Py_None);
    self->pending = NULL;
    return p;
}
static PyObject *Lane_get_pending(Lane *self, void *Py_UNUSED(c)) { return PyBool_FromLong(self->pending != NULL); }

static PyObject *Lane_forget(Lane *self, PyObject *Py_UNUSED(ignored)) {
    Lane_clear_cache(self);
    Py_RETURN_NONE;
}

static PyMethodDef Lane_methods[] = {
    {"all_reduce", (PyCFunction)(void (*)(void))Lane_all_reduce, METH_FASTCALL | METH_KEYWORDS,
     "all_reduce(x[, op[, given]]): in place: a done Work, a Handover for the engine to carry on, or a Declined"},
    {"run", (PyCFunction)(void (*)(void))acpy_lane_run, METH_FASTCALL,
     "run(code, x, out, op, root[, gx, gout]): a call of a form learnt before (lane_calls.c): a done Work, "
     "a Handover for the engine to carry on, or a Declined (Declined('form'): the general way, which teaches it)"},
    {"call", (PyCFunction)(void (*)(void))Lane_call, METH_FASTCALL,
     "call(code, x, out, op, root): all_reduce for an in-place all_reduce, else run: the door's first try"},
    {"teach", (PyCFunction)(void (*)(void))acpy_lane_teach, METH_FASTCALL,
     "teach(code, x, out, op, root, (program, name, desc, template, in_from, out_from, gives, dtype, fresh))"},
    {"take", (PyCFunction)Lane_take, METH_O, "take(on_channel): the next (seq, order); order -1 off the channel"},
    {"learn", (PyCFunction)(void (*)(void))Lane_learn, METH_FASTCALL, "learn(count, dtype, program)"},
    {"forget", (PyCFunction)Lane_forget, METH_NOARGS, "drop the learnt programs"},
    {"claim", (PyCFunction)Lane_claim, METH_NOARGS, "the Handover given to the engine and not yet claimed, or None"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Lane_getset[] = {
    {"seq", (getter)Lane_get_seq, NULL, "the next sequence number", NULL},
    {"order", (getter)Lane_get_order, NULL, "the next channel order", NULL},
    {"pending", (getter)Lane_get_pending, NULL, "whether an op handed to the engine waits to be claimed", NULL},
    {"ran", (getter)Lane_get_ran, NULL, "how many calls run() finished in C", NULL},
    {"enabled", (getter)Lane_get_enabled, (setter)Lane_set_enabled, "whether all_reduce may take ops", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject acpy_LaneType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aioccl.native._core.Lane",
    .tp_doc = "A communicator's counters and its small all_reduce in C (see fast_lane.c)",
    .tp_basicsize = sizeof(Lane),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Lane_init,
    .tp_dealloc = (destructor)Lane_dealloc,
    .tp_traverse = (traverseproc)Lane_traverse,
    .tp_clear = (inquiry)Lane_clear,
    .tp_methods = Lane_methods,
    .tp_getset = Lane_getset,
};

_Thread_local int acpy_lane_learning;

static PyObject *set_learning(PyObject *Py_UNUSED(m), PyObject *on) {
    int yes = PyObject_IsTrue(on);
    if (yes < 0)
        return NULL;
    acpy_lane_learning = yes;
    Py_RETURN_NONE;
}

static PyMethodDef set_learning_def = {"set_learning", set_learning, METH_O,
                                       "set_learning(on): jax_ext learns on this thread what an op runs (lane.h)"};

int acpy_fast_lane_ready(PyObject *m) {
    struct { PyObject **at; const char *s; } names[] = {
        {&s_acquire, "acquire"},
        {&s_release, "release"}, {&s_sum, "sum"}, {&s_prod, "prod"}, {&s_min, "min"}, {&s_max, "max"},
        {&s_avg, "avg"}, {&s_torch, "torch"}, {&s_Tensor, "Tensor"}, {&s_is_cuda, "is_cuda"}, {&s_numpy, "numpy"},
        {&s_ml_dtypes, "ml_dtypes"}, {&s_bfloat16, "bfloat16"},
    };
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if ((*names[k].at = PyUnicode_InternFromString(names[k].s)) == NULL)
            return -1;
    if (PyType_Ready(&acpy_LaneType) < 0)
        return -1;
    PyObject *fn = PyCFunction_New(&set_learning_def, NULL);
    if (fn == NULL || PyModule_AddObject(m, "set_learning", fn) < 0) {
        Py_XDECREF(fn);
        return -1;
    }
    return PyModule_AddObjectRef(m, "Lane", (PyObject *)&acpy_LaneType);
}
