/* The GPU lane: comm.all_reduce(cupy_array) and the other collectives of the CUDA-IPC device path, from
 * the call to the launches on the op's stream, in C (aioccl/gpu/device_path.py owns it).
 *
 * Python builds an op's launches once per call site (buffers, count, dtype, op, stream) as a GpuPlan:
 * each launch's function, grid and arguments, packed. The lane runs a plan: it takes the op's epochs,
 * launches each piece (spin form: one kernel; stream form: publish, a flag write, a wait per peer,
 * consume), records the op's CUDA event, and keeps the op in a bounded window of ops in flight (its event, deadline
 * and buffers) that the engine's watch reads (`oldest`), and its epochs in a table that names a kernel's
 * failure (`recent`). `run` is the whole op for a call seen before: argument checks, sequence number,
 * plan, launches, a Work born done with its event, the flight recorder; None sends the caller the
 * general way (a new call, another device's context, a capturing stream, a failure to report, a group
 * open, the lane switched off: its owner does that when the communicator closes, shrinks or loses a rank).
 *
 * The launches, the window and the epochs are core/launch.c's (pure C); this file owns the Python objects
 * that go with an in-flight slot: the event object whose handle the slot records (reused once nobody else holds
 * it) and the op's buffers, kept until the slot retires. The driver calls are made with the GIL released,
 * under the launcher's mutex: ops on one communicator get their epochs and reach their streams in one
 * order, whatever thread issues them. */
#include "answers.h"
#include "gpu_lane.h"

#include <string.h>

#include "core/cuda_driver.h"
#include "core/launch.h"
#include "gpu_plan.h"
#include "work.h"

enum { MAX_ENTRIES = 512 };

/* attribute names of a GPU array and a torch tensor's methods, interned once (acpy_gpu_lane_ready) */
static PyObject *s_data, *s_ptr, *s_strides, *s_size, *s_dtype, *s_num, *s_data_ptr, *s_stride, *s_numel, *s_is_cuda;

/* -- GpuLane ------------------------------------------------------------------------------------------ */
typedef struct {
    PyObject_HEAD
    acpy_work_maker wm;
    PyObject *record, *group_var, *array_type, *current_stream, *event_factory, *entries;
    /* torch tensors, once take_tensors() was called: their type, torch's current stream of a device (a raw
     * handle: torch._C._cuda_getCurrentRawStream) and this lane's device, its argument */
    PyObject *tensor_type, *tensor_stream, *tensor_device;
    volatile unsigned *err;
    unsigned closed_err[4]; /* what err points to once closed: the path's memory may be freed */
    int enabled;
    cu_handle ctx;
    long long seq; /* atomic */
    long long ran; /* ops run() did */
    PyObject *event[AC_TRACKED], *keep[AC_TRACKED]; /* per in-flight slot: its event object, the op's buffers */
    ac_launcher launch;
} GpuLane;

#define GPU_LANE_REFS(s) {&(s)->record, &(s)->group_var, &(s)->array_type, &(s)->current_stream, \
    &(s)->event_factory, &(s)->entries, &(s)->tensor_type, &(s)->tensor_stream, &(s)->tensor_device}

static int GpuLane_traverse(GpuLane *self, visitproc visit, void *arg) {
    PyObject **refs[] = GPU_LANE_REFS(self);
    for (size_t k = 0; k < sizeof refs / sizeof refs[0]; k++)
        Py_VISIT(*refs[k]);
    for (int k = 0; k < AC_TRACKED; k++) {
        Py_VISIT(self->event[k]);
        Py_VISIT(self->keep[k]);
    }
    return acpy_work_maker_traverse(&self->wm, visit, arg);
}

static int GpuLane_clear(GpuLane *self) {
    PyObject **refs[] = GPU_LANE_REFS(self);
    for (size_t k = 0; k < sizeof refs / sizeof refs[0]; k++)
        Py_CLEAR(*refs[k]);
    for (int k = 0; k < AC_TRACKED; k++) {
        Py_CLEAR(self->event[k]);
        Py_CLEAR(self->keep[k]);
    }
    self->launch.count = 0;
    self->enabled = 0;
    acpy_work_maker_clear(&self->wm);
    return 0;
}

static void GpuLane_dealloc(GpuLane *self) {
    PyObject_GC_UnTrack(self);
    GpuLane_clear(self);
    ac_launcher_destroy(&self->launch);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *GpuLane_new(PyTypeObject *type, PyObject *Py_UNUSED(a), PyObject *Py_UNUSED(k)) {
    GpuLane *self = (GpuLane *)type->tp_alloc(type, 0);
    if (self != NULL) {
        unsigned long long one = 0;
        ac_launcher_init(&self->launch, 0, 0, 1, &one, 0); /* (a mutex to destroy, whatever __init__ does) */
    }
    return (PyObject *)self;
}

/* GpuLane(work_type, done_lock, home, thread_id, record, group_var, array_type, current_stream,
 *         event_factory, err_ptr, form, rank, flags, context, seq, epoch)
 * form: 0 spin, 1 stream; flags: every rank's flag word as mapped here (rank's own included) */
static int GpuLane_init(GpuLane *self, PyObject *args, PyObject *Py_UNUSED(kwds)) {
    PyObject *work_type, *done_lock, *home, *record, *group_var, *array_type, *cur, *factory, *flags, *err, *ctx;
    unsigned long thread_id;
    int form, rank;
    long long seq;
    unsigned epoch;
    if (!PyArg_ParseTuple(args, "OOOkOOOOOOiiO!OLI", &work_type, &done_lock, &home, &thread_id, &record,
                          &group_var, &array_type, &cur, &factory, &err, &form, &rank, &PyTuple_Type, &flags, &ctx,
                          &seq, &epoch))
        return -1;
    if (ac_cuda == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "GpuLane: the CUDA driver is not loaded (load_cuda)");
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(flags);
    unsigned long long fl[AC_MAX_PEERS];
    for (Py_ssize_t r = 0; r < n && r < AC_MAX_PEERS; r++)
        fl[r] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(flags, r));
    if (PyErr_Occurred())
        return -1;
    ac_launcher_destroy(&self->launch);
    if (ac_launcher_init(&self->launch, form, rank, (int)n, fl, epoch) < 0) {
        ac_launcher_init(&self->launch, 0, 0, 1, fl, 0);
        PyErr_Format(PyExc_ValueError, "GpuLane: 1 to %d ranks, a rank among them, form 0 or 1", AC_MAX_PEERS);
        return -1;
    }
    self->err = (volatile unsigned *)PyLong_AsVoidPtr(err);
    self->ctx = PyLong_AsVoidPtr(ctx);
    if (PyErr_Occurred())
        return -1;
    if (self->err == NULL) {
        PyErr_SetString(PyExc_ValueError, "GpuLane: no error word");
        return -1;
    }
    if (acpy_work_maker_init(&self->wm, work_type, done_lock, home, thread_id) < 0)
        return -1;
    PyObject *entries = PyDict_New();
    if (entries == NULL)
        return -1;
    Py_XSETREF(self->entries, entries);
    Py_XSETREF(self->record, Py_NewRef(record));
    Py_XSETREF(self->group_var, Py_NewRef(group_var));
    Py_XSETREF(self->array_type, Py_NewRef(array_type));
    Py_XSETREF(self->current_stream, Py_NewRef(cur));
    Py_XSETREF(self->event_factory, Py_NewRef(factory));
    self->seq = seq;
    self->enabled = 0; /* the owner switches it on once no op queued before it is still waiting */
    return 0;
}

/* -- running a plan ------------------------------------------------------------------------------------ */
static void set_driver_error(ac_driver_error de) {
    char buf[160];
    PyErr_SetString(PyExc_RuntimeError, ac_driver_error_text(de, buf, sizeof buf));
}

/* forget the oldest ops whose events completed (their buffers with them); how many remain */
static int drop_done(GpuLane *s) {
    int slot;
    while ((slot = ac_launcher_retire(&s->launch)) >= 0)
        Py_CLEAR(s->keep[slot]);
    return s->launch.count;
}

/* The slot the next op is tracked in, with an event for it, taken (the oldest op is waited for when every
 * slot is in use). With the GIL: two threads never take one slot. */
static int reserve(GpuLane *s, PyObject *keep) {
    ac_launcher *l = &s->launch;
    if (l->count >= AC_TRACKED / 2 && l->head % 32 == 0) /* a look every 32 ops keeps the window half empty */
        drop_done(s);
    int slot;
    while ((slot = ac_launcher_reserve(l)) < 0) { /* the budget: the oldest must end first (its deadline bounds
                                                    * the wait) */
        ac_tracked *old = ac_launcher_oldest(l);
        cu_handle h = old->event;
        int launched = old->state == AC_SLOT_LAUNCHED;
        Py_BEGIN_ALLOW_THREADS
        ac_launcher_wait(h, launched);
        Py_END_ALLOW_THREADS
        drop_done(s);
    }
    if (s->event[slot] == NULL || Py_REFCNT(s->event[slot]) > 1) { /* someone holds the old event: a new one */
        PyObject *ev = PyObject_CallNoArgs(s->event_factory);
        PyObject *ptr = ev ? PyObject_GetAttr(ev, s_ptr) : NULL;
        cu_handle h = ptr ? PyLong_AsVoidPtr(ptr) : NULL;
        Py_XDECREF(ptr);
        if (h == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_RuntimeError, "the event factory made an event without a handle");
            Py_XDECREF(ev);
            ac_launcher_unreserve(l, slot);
            return -1;
        }
        Py_XSETREF(s->event[slot], ev);
        l->inflight[slot].event = h;
    }
    Py_XSETREF(s->keep[slot], Py_NewRef(keep));
    return slot;
}

/* The op on the GPU: its event (a new reference), or Py_None when not tracked (a CUDA graph's capture). */
static PyObject *enqueue(GpuLane *s, GpuPlan *p, cu_handle stream, long long seq, int kind, double timeout,
                         PyObject *keep, int track) {
    int slot = -1;
    if (track && (slot = reserve(s, keep)) < 0)
        return NULL;
    cu_handle ev = slot >= 0 ? s->launch.inflight[slot].event : NULL;
    ac_driver_error de;
    unsigned epoch;
    Py_BEGIN_ALLOW_THREADS
    de = ac_launcher_launch(&s->launch, &p->p, stream, ev, seq, kind, timeout, &epoch);
    Py_END_ALLOW_THREADS
    if (slot >= 0)
        ac_launcher_track(&s->launch, slot, de.rc == CU_SUCCESS, seq, kind, timeout,
                          acpy_work_monotonic() + timeout + 1.0, epoch);
    if (de.rc != CU_SUCCESS) {
        set_driver_error(de);
        return NULL;
    }
    return slot >= 0 ? Py_NewRef(s->event[slot]) : Py_NewRef(Py_None);
}

/* enqueue(plan, stream, seq, kind, timeout, keep, track): the general way's launch (device_path.py) */
static PyObject *GpuLane_enqueue(GpuLane *self, PyObject *args) {
    PyObject *plan, *stream, *keep;
    long long seq;
    int kind, track;
    double timeout;
    if (!PyArg_ParseTuple(args, "O!OLidOp", &acpy_GpuPlanType, &plan, &stream, &seq, &kind, &timeout, &keep, &track))
        return NULL;
    cu_handle h = PyLong_AsVoidPtr(stream);
    if (PyErr_Occurred())
        return NULL;
    return enqueue(self, (GpuPlan *)plan, h, seq, kind, timeout, keep, track);
}

/* -- the fast path: a call seen before ---------------------------------------------------------------- */
static PyObject *attr2(PyObject *o, PyObject *a, PyObject *b) {
    PyObject *mid = PyObject_GetAttr(o, a);
    PyObject *v = mid ? PyObject_GetAttr(mid, b) : NULL;
    Py_XDECREF(mid);
    return v;
}

static int is_tensor(GpuLane *s, PyObject *a) {
    return s->tensor_type != NULL && Py_TYPE(a) == (PyTypeObject *)s->tensor_type;
}

/* a tensor on a CUDA device (a CPU tensor goes the general way: its address is never looked up); -1: error */
static int on_cuda(PyObject *a) {
    PyObject *v = PyObject_GetAttr(a, s_is_cuda);
    int yes = v == NULL ? -1 : v == Py_True;
    Py_XDECREF(v);
    return yes;
}

/* address, strides, size and dtype number of a GPU array: the buffer a plan was made for, exactly (a view
 * of the same memory with other strides, or another array at a reused address, is another buffer); of a
 * torch tensor, data_ptr(), stride(), numel() and its dtype (whose objects are never a cupy dtype's number) */
static int describe(GpuLane *s, PyObject *a, PyObject **out) {
    if (is_tensor(s, a)) {
        out[0] = PyObject_CallMethodNoArgs(a, s_data_ptr);
        out[1] = out[0] ? PyObject_CallMethodNoArgs(a, s_stride) : NULL;
        out[2] = out[1] ? PyObject_CallMethodNoArgs(a, s_numel) : NULL;
        out[3] = out[2] ? PyObject_GetAttr(a, s_dtype) : NULL;
        return out[3] ? 0 : -1;
    }
    out[0] = attr2(a, s_data, s_ptr);
    out[1] = PyObject_GetAttr(a, s_strides);
    out[2] = PyObject_GetAttr(a, s_size);
    PyObject *dt = PyObject_GetAttr(a, s_dtype);
    out[3] = dt ? PyObject_GetAttr(dt, s_num) : NULL;
    Py_XDECREF(dt);
    return out[0] && out[1] && out[2] && out[3] ? 0 : -1;
}

/* (code, x's description, out's or Nones, op, root, stream): what a plan is kept by */
static PyObject *make_key(GpuLane *s, PyObject *code, PyObject *x, PyObject *out, PyObject *op, PyObject *root,
                          PyObject *stream) {
    PyObject *d[8] = {NULL};
    int ok = describe(s, x, d) == 0;
    if (ok && out != Py_None)
        ok = describe(s, out, d + 4) == 0;
    else
        for (int k = 4; k < 8; k++)
            d[k] = Py_NewRef(Py_None);
    PyObject *key = ok ? PyTuple_Pack(12, code, d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], op, root, stream) : NULL;
    for (int k = 0; k < 8; k++)
        Py_XDECREF(d[k]);
    return key;
}

/* key(code, x, out, op, root, stream): the key `run` finds this call's plan by */
static PyObject *GpuLane_key(GpuLane *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "key(code, x, out, op, root, stream)");
        return NULL;
    }
    return make_key(self, args[0], args[1], args[2], args[3], args[4], args[5]);
}

/* take_tensors(tensor_type, stream_of_device, device): run() takes calls on that type's tensors too, on the
 * stream stream_of_device(device) gives (torch's current stream, what torch's own kernels use) */
static PyObject *GpuLane_take_tensors(GpuLane *self, PyObject *args) {
    PyObject *type, *stream_of, *device;
    if (!PyArg_ParseTuple(args, "O!OO", &PyType_Type, &type, &stream_of, &device))
        return NULL;
    if (!PyCallable_Check(stream_of)) {
        PyErr_SetString(PyExc_TypeError, "take_tensors: stream_of_device must be callable");
        return NULL;
    }
    Py_XSETREF(self->tensor_type, Py_NewRef(type));
    Py_XSETREF(self->tensor_stream, Py_NewRef(stream_of));
    Py_XSETREF(self->tensor_device, Py_NewRef(device));
    Py_RETURN_NONE;
}

/* learn(key, (plan, name, desc, kind, timeout, gives)): `run` takes this call from now on; gives: what its
 * Work gives back, 0 x, 1 out, 2 None (a rooted op's other ranks) */
static PyObject *GpuLane_learn(GpuLane *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *e = nargs == 2 ? args[1] : NULL;
    long gives = e != NULL && PyTuple_Check(e) && PyTuple_GET_SIZE(e) == 6 && PyLong_Check(PyTuple_GET_ITEM(e, 5))
                     ? PyLong_AsLong(PyTuple_GET_ITEM(e, 5)) : -1;
    if (e == NULL || !PyTuple_Check(args[0]) || gives < 0 || gives > 2 ||
        !PyObject_TypeCheck(PyTuple_GET_ITEM(e, 0), &acpy_GpuPlanType) || !PyLong_Check(PyTuple_GET_ITEM(e, 3)) ||
        !PyFloat_Check(PyTuple_GET_ITEM(e, 4))) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "learn(key, (plan, name, desc, kind: int, timeout: float, gives: 0 x, "
                                         "1 out or 2 None))");
        return NULL;
    }
    if (PyDict_GET_SIZE(self->entries) >= MAX_ENTRIES)
        PyDict_Clear(self->entries);
    if (PyDict_SetItem(self->entries, args[0], e) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* whether stream h is capturing a CUDA graph (the general way's: the legacy default stream, 0, cannot) */
static int capturing(cu_handle h) {
    int yes = 0;
    return h != NULL && (ac_cuda->stream_is_capturing(h, &yes) != CU_SUCCESS || yes);
}

/* A learnt entry's op (plan, name, desc, kind, timeout) on stream h, its buffers kept in `keep`: its event (a new
 * reference) and *seq; NULL and no exception when the lane closed meanwhile; NULL and an exception else. */
static PyObject *launch_entry(GpuLane *s, PyObject *entry, cu_handle h, PyObject *keep, long long *seq) {
    int kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(entry, 3));
    if (kind == -1 && PyErr_Occurred())
        return NULL;
    *seq = __atomic_fetch_add(&s->seq, 1, __ATOMIC_RELAXED);
    PyObject *ev = enqueue(s, (GpuPlan *)PyTuple_GET_ITEM(entry, 0), h, *seq, kind,
                           PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(entry, 4)), keep, 1);
    if (ev == NULL && ac_launcher_closed(&s->launch))
        PyErr_Clear();
    return ev;
}

/* run(code, x, out, op, root): the op of a call learnt before, from the call to the done Work; else a Declined
 * (answers.h): the call is new ('form'), the caller's device or stream is not the plan's or a graph is being
 * captured ('device'), the lane is off. x and out are both GPU arrays of the lane's array type, or both tensors
 * of take_tensors()'s type */
static PyObject *GpuLane_run(GpuLane *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!self->enabled || nargs != 5 || self->err[0] != 0)
        return acpy_declined(ACPY_NO_OFF);
    int tensors = is_tensor(self, args[1]);
    PyTypeObject *type = tensors ? Py_TYPE(args[1]) : (PyTypeObject *)self->array_type;
    if (Py_TYPE(args[1]) != type || (args[2] != Py_None && Py_TYPE(args[2]) != type))
        return acpy_declined(ACPY_NO_BUFFERS);
    if (tensors) {
        int cuda = on_cuda(args[1]);
        if (cuda > 0 && args[2] != Py_None)
            cuda = on_cuda(args[2]);
        if (cuda <= 0)
            return cuda < 0 ? NULL : acpy_declined(ACPY_NO_BUFFERS);
    }
    double t0 = acpy_work_monotonic();
    cu_handle ctx = NULL;
    if (ac_cuda->ctx_current(&ctx) != CU_SUCCESS || ctx != self->ctx) /* another device's, or none yet */
        return acpy_declined(ACPY_NO_DEVICE);
    int open = acpy_work_no_group(self->group_var); /* (closing, shrinking, a lost rank: the owner switches the
                                                     * lane off) */
    if (open <= 0)
        return open < 0 ? NULL : acpy_declined(ACPY_NO_GROUP);
    PyObject *stream = tensors ? PyObject_CallOneArg(self->tensor_stream, self->tensor_device) /* a handle */
                               : PyObject_CallNoArgs(self->current_stream); /* cupy's Stream, or its handle */
    if (stream != NULL && !PyLong_Check(stream))
        Py_SETREF(stream, PyObject_GetAttr(stream, s_ptr));
    if (stream == NULL)
        return NULL;
    PyObject *key = make_key(self, args[0], args[1], args[2], args[3], args[4], stream);
    PyObject *entry = key ? PyDict_GetItemWithError(self->entries, key) : NULL;
    Py_XDECREF(key);
    cu_handle h = PyLong_AsVoidPtr(stream);
    Py_DECREF(stream);
    if (entry == NULL || PyErr_Occurred()) /* (the stream is in the key: another stream is another form) */
        return PyErr_Occurred() ? NULL : acpy_declined(ACPY_NO_FORM);
    if (capturing(h))
        return acpy_declined(ACPY_NO_DEVICE);
    Py_INCREF(entry); /* (a learn() from another thread may replace it while the GIL is released) */
    PyObject *name = PyTuple_GET_ITEM(entry, 1), *desc = PyTuple_GET_ITEM(entry, 2);
    long gives = PyLong_AsLong(PyTuple_GET_ITEM(entry, 5));
    PyObject *result = gives == 0 ? args[1] : gives == 1 ? args[2] : Py_None;
    long long seq;
    PyObject *keep = PyTuple_Pack(2, args[1], args[2]);
    PyObject *ev = keep ? launch_entry(self, entry, h, keep, &seq) : NULL;
    Py_XDECREF(keep);
    if (ev == NULL && !PyErr_Occurred()) { /* closed meanwhile: the general way says so, in aioccl's words */
        Py_DECREF(entry);
        return acpy_declined(ACPY_NO_OFF);
    }
    PyObject *w = ev ? acpy_work_born_done(&self->wm, name, seq, result, desc, t0) : NULL;
    if (w != NULL) {
        self->ran++;
        acpy_work_set(&self->wm, w, ACPY_WORK_SLOT_EVENT, Py_NewRef(ev));
        if (acpy_work_record(self->record, name, seq, desc, t0) < 0)
            Py_CLEAR(w);
    }
    Py_XDECREF(ev);
    Py_DECREF(entry);
    return w;
}

int acpy_gpu_lane_launch(PyObject *lane, PyObject *entry, void *stream) {
    if (!PyObject_TypeCheck(lane, &acpy_GpuLaneType) || !PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) < 5 ||
        !PyObject_TypeCheck(PyTuple_GET_ITEM(entry, 0), &acpy_GpuPlanType) || !PyFloat_Check(PyTuple_GET_ITEM(entry, 4))) {
        PyErr_SetString(PyExc_TypeError, "acpy_gpu_lane_launch: a GpuLane and (plan, name, desc, kind, timeout)");
        return -1;
    }
    GpuLane *self = (GpuLane *)lane;
    if (!self->enabled || self->err[0] != 0)
        return 0;
    double t0 = acpy_work_monotonic();
    cu_handle ctx = NULL, h = stream;
    if (ac_cuda->ctx_current(&ctx) != CU_SUCCESS || ctx != self->ctx || capturing(h))
        return 0;
    Py_INCREF(entry); /* (a learn from another thread may replace it while the GIL is released) */
    long long seq;
    PyObject *ev = launch_entry(self, entry, h, Py_None, &seq);
    int rc = ev != NULL ? 1 : PyErr_Occurred() ? -1 : 0; /* (0: closed meanwhile, the general way says so) */
    if (rc == 1) {
        self->ran++;
        if (acpy_work_record(self->record, PyTuple_GET_ITEM(entry, 1), seq, PyTuple_GET_ITEM(entry, 2), t0) < 0)
            rc = -1;
    }
    Py_XDECREF(ev);
    Py_DECREF(entry);
    return rc;
}

/* -- the watch's view ------------------------------------------------------------------------------------ */
/* oldest(): (seq, kind, epoch, deadline, timeout) of the oldest op still on the GPU, or None */
static PyObject *GpuLane_oldest(GpuLane *self, PyObject *Py_UNUSED(ignored)) {
    if (drop_done(self) == 0)
        Py_RETURN_NONE;
    ac_tracked *t = ac_launcher_oldest(&self->launch);
    if (t->state == AC_SLOT_RESERVED) /* being launched by another thread: not late yet */
        Py_RETURN_NONE;
    return Py_BuildValue("(LiIdd)", t->seq, t->kind, t->epoch, t->deadline, t->timeout);
}

/* recent(epoch): (seq, kind, timeout) of the op that ran piece `epoch`, or None when it is too old */
static PyObject *GpuLane_recent(GpuLane *self, PyObject *arg) {
    unsigned long e = PyLong_AsUnsignedLongMask(arg);
    if (PyErr_Occurred())
        return NULL;
    /* without the mutex: a thread holding the GIL never waits for one that may be waiting for the GIL */
    long long seq;
    int kind;
    double timeout;
    if (!ac_launcher_recent(&self->launch, (unsigned)e, &seq, &kind, &timeout))
        Py_RETURN_NONE;
    return Py_BuildValue("(Lid)", seq, kind, timeout);
}

static PyObject *GpuLane_take(GpuLane *self, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromLongLong(__atomic_fetch_add(&self->seq, 1, __ATOMIC_RELAXED));
}

/* close(): no op reaches the GPU through this lane from now on (one being launched ends first); the error
 * word it reads becomes its own, so the device path may free its memory */
static PyObject *GpuLane_close(GpuLane *self, PyObject *Py_UNUSED(ignored)) {
    self->enabled = 0;
    Py_BEGIN_ALLOW_THREADS
    ac_launcher_close(&self->launch);
    Py_END_ALLOW_THREADS
    self->closed_err[0] = 3; /* ERR_ABORT: run() sends every call the general way */
    self->err = self->closed_err;
    Py_RETURN_NONE;
}

static PyObject *GpuLane_get_enabled(GpuLane *self, void *Py_UNUSED(c)) { return PyBool_FromLong(self->enabled); }
static int GpuLane_set_enabled(GpuLane *self, PyObject *v, void *Py_UNUSED(c)) {
    int on = v ? PyObject_IsTrue(v) : 0;
    if (on < 0)
        return -1;
    self->enabled = on && self->entries != NULL && !ac_launcher_closed(&self->launch);
    return 0;
}
static PyObject *GpuLane_get_epoch(GpuLane *self, void *Py_UNUSED(c)) {
    return PyLong_FromUnsignedLong(ac_launcher_epoch(&self->launch));
}
static PyObject *GpuLane_get_seq(GpuLane *self, void *Py_UNUSED(c)) {
    return PyLong_FromLongLong(__atomic_load_n(&self->seq, __ATOMIC_RELAXED));
}
static PyObject *GpuLane_get_ran(GpuLane *self, void *Py_UNUSED(c)) { return PyLong_FromLongLong(self->ran); }
static PyObject *GpuLane_get_tracked(GpuLane *self, void *Py_UNUSED(c)) {
    return PyLong_FromLong(self->launch.count);
}

static PyMethodDef GpuLane_methods[] = {
    {"run", (PyCFunction)(void (*)(void))GpuLane_run, METH_FASTCALL,
     "run(code, x, out, op, root): the done Work of a call learnt before, or None: the general way"},
    {"enqueue", (PyCFunction)GpuLane_enqueue, METH_VARARGS,
     "enqueue(plan, stream, seq, kind, timeout, keep, track): launch; the op's event (None untracked)"},
    {"key", (PyCFunction)(void (*)(void))GpuLane_key, METH_FASTCALL, "key(code, x, out, op, root, stream)"},
    {"take_tensors", (PyCFunction)GpuLane_take_tensors, METH_VARARGS,
     "take_tensors(tensor_type, stream_of_device, device): run() takes that type's tensors too"},
    {"learn", (PyCFunction)(void (*)(void))GpuLane_learn, METH_FASTCALL,
     "learn(key, (plan, name, desc, kind, timeout))"},
    {"oldest", (PyCFunction)GpuLane_oldest, METH_NOARGS,
     "(seq, kind, epoch, deadline, timeout) of the oldest op not done on the GPU, or None"},
    {"recent", (PyCFunction)GpuLane_recent, METH_O, "recent(epoch): (seq, kind, timeout), or None"},
    {"take", (PyCFunction)GpuLane_take, METH_NOARGS, "the next sequence number"},
    {"close", (PyCFunction)GpuLane_close, METH_NOARGS, "no op reaches the GPU through the lane any more"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef GpuLane_getset[] = {
    {"enabled", (getter)GpuLane_get_enabled, (setter)GpuLane_set_enabled, "whether run() takes ops", NULL},
    {"epoch", (getter)GpuLane_get_epoch, NULL, "pieces launched so far (the device's count, graphs aside)", NULL},
    {"seq", (getter)GpuLane_get_seq, NULL, "the sequence number the next op takes", NULL},
    {"ran", (getter)GpuLane_get_ran, NULL, "ops run() did, from the call to the done Work", NULL},
    {"tracked", (getter)GpuLane_get_tracked, NULL, "ops in flight (not yet seen done)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject acpy_GpuLaneType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aioccl.native._core.GpuLane",
    .tp_basicsize = sizeof(GpuLane),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The GPU lane: a device-path collective from the call to its launches (gpu_lane.c)",
    .tp_new = GpuLane_new,
    .tp_init = (initproc)GpuLane_init,
    .tp_dealloc = (destructor)GpuLane_dealloc,
    .tp_traverse = (traverseproc)GpuLane_traverse,
    .tp_clear = (inquiry)GpuLane_clear,
    .tp_methods = GpuLane_methods,
    .tp_getset = GpuLane_getset,
};

PyObject *acpy_gpu_load_cuda(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    const char *path = NULL;
    if (nargs > 1 || (nargs == 1 && args[0] != Py_None && !PyUnicode_Check(args[0]))) {
        PyErr_SetString(PyExc_TypeError, "load_cuda([path])");
        return NULL;
    }
    if (nargs == 1 && args[0] != Py_None && (path = PyUnicode_AsUTF8(args[0])) == NULL)
        return NULL;
    char why[512];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ac_cuda_load(path, why, sizeof why);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        PyErr_SetString(PyExc_OSError, why);
        return NULL;
    }
    Py_RETURN_NONE;
}

int acpy_gpu_lane_ready(PyObject *m) {
    struct { PyObject **at; const char *s; } names[] = {
        {&s_data, "data"}, {&s_ptr, "ptr"}, {&s_strides, "strides"}, {&s_size, "size"}, {&s_dtype, "dtype"},
        {&s_num, "num"}, {&s_data_ptr, "data_ptr"}, {&s_stride, "stride"}, {&s_numel, "numel"},
        {&s_is_cuda, "is_cuda"},
    };
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if ((*names[k].at = PyUnicode_InternFromString(names[k].s)) == NULL)
            return -1;
    if (PyType_Ready(&acpy_GpuPlanType) < 0 || PyType_Ready(&acpy_GpuLaneType) < 0)
        return -1;
    if (PyModule_AddObjectRef(m, "GpuPlan", (PyObject *)&acpy_GpuPlanType) < 0 ||
        PyModule_AddObjectRef(m, "GpuLane", (PyObject *)&acpy_GpuLaneType) < 0)
        return -1;
    return 0;
}
