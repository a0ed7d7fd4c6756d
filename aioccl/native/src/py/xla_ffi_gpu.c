/* jax_ext's XLA custom calls on a GPU: typed FFI handlers for the CUDA platform (api_version 1).
 *
 * The same sites as on the CPU (xla_site.h; made and taught by jax_ext/native_call.py). A call takes XLA's
 * stream (XLA_FFI_Stream_Get) and never synchronises the host. A site member that learnt the op for this
 * call's buffers and stream launches it through its communicator's GPU lane (gpu_lane.c's
 * acpy_gpu_lane_launch: the learnt plan, the op's sequence number, its event in the window the engine's
 * watch reads, its flight-recorder entry), with the GIL held for that bookkeeping and released around the
 * driver's calls: no Python code runs, no cupy object is made. Everything else goes to the site's GPU
 * fallback (Python, with the GIL):
 *   - the first call of each buffer pair and stream: it runs the op the engine's way on cupy views of
 *     XLA's buffers, on XLA's stream, and teaches the member the plan the GPU lane launched for it
 *     (ffi_gpu_learn), so that the next such call is native;
 *   - a lane that is off or a kernel that failed (the general way raises the failure), a buffer of a size
 *     other than the site's (the fallback says so).
 * A site of several members (a mesh-level op: a communicator per mesh position) finds the member by the
 * call it learnt (learnt() says why that is sound); only the fallback reads the mesh position, which lies in
 * device memory, after the kernels before it.
 *
 * Not command-buffer (CUDA graph) compatible, on purpose: the handler declares no traits, so XLA calls it
 * at every execution. Each op takes its sequence number, its pieces' epochs (the flag values its kernels
 * wait for) and its slot in the watch's window on the host, at launch; a replayed graph would launch
 * kernels with the epochs of the capture, which the peers have passed, and ops the host never numbered. */
#include <string.h>

#include "core/cuda_driver.h"
#include "gpu_lane.h"
#include "xla_site.h"

enum { GPU_PLANS_MAX = 64 };

/* 1 and launched; 0: no member of the site has learnt this call; -1: an exception.
 * The member is found by the call it learnt, not by the mesh position (device memory, not read here): the
 * key holds XLA's stream, a stream belongs to one device's context, and a mesh holds a device once, so only
 * the member on the device XLA runs this call on can have learnt that stream. */
static int learnt(acpy_ffi_site *s, XLA_FFI_Buffer *in, XLA_FFI_Buffer *out, void *stream) {
    PyObject *key = NULL;
    for (int k = 0; k < s->nmembers; k++) {
        acpy_ffi_member *m = &s->members[k];
        if (m->gpu_lane == NULL || m->gpu_plans == NULL)
            continue;
        if (key == NULL && (key = Py_BuildValue("(KKnnK)", (unsigned long long)(uintptr_t)(in ? in->data : NULL),
                                                (unsigned long long)(uintptr_t)(out ? out->data : NULL),
                                                (Py_ssize_t)(in ? acpy_ffi_bytes(in) : 0),
                                                (Py_ssize_t)(out ? acpy_ffi_bytes(out) : 0),
                                                (unsigned long long)(uintptr_t)stream)) == NULL)
            return -1;
        PyObject *entry = PyDict_GetItemWithError(m->gpu_plans, key);
        if (entry != NULL) {
            Py_DECREF(key);
            return acpy_gpu_lane_launch(m->gpu_lane, entry, stream);
        }
        if (PyErr_Occurred()) {
            Py_DECREF(key);
            return -1;
        }
    }
    Py_XDECREF(key);
    return 0;
}

static PyObject *spans(XLA_FFI_Buffer *const *bufs, int n) {
    PyObject *list = PyList_New(n);
    for (int k = 0; list != NULL && k < n; k++) {
        PyObject *t = Py_BuildValue("(Kn)", (unsigned long long)(uintptr_t)bufs[k]->data,
                                    (Py_ssize_t)acpy_ffi_bytes(bufs[k]));
        if (t == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, k, t);
    }
    return list;
}

/* gpu_fallback(stream, position address, ins, outs): 1, or -1 with an exception */
static int fallback(acpy_ffi_site *s, const acpy_ffi_call *c, void *stream) {
    __atomic_fetch_add(&acpy_ffi_calls_python, 1, __ATOMIC_RELAXED);
    PyObject *ins = spans(c->ins, c->nin), *outs = spans(c->outs, c->nout), *r = NULL;
    if (ins != NULL && outs != NULL)
        r = PyObject_CallFunction(s->gpu_fallback, "KKOO", (unsigned long long)(uintptr_t)stream,
                                  (unsigned long long)(uintptr_t)c->where->data, ins, outs);
    Py_XDECREF(ins);
    Py_XDECREF(outs);
    Py_XDECREF(r);
    return r != NULL ? 1 : -1;
}

static XLA_FFI_Error *handle(XLA_FFI_CallFrame *cf, int kind) {
    acpy_ffi_call c;
    XLA_FFI_Error *err = acpy_ffi_read(cf, kind, &c);
    if (err != NULL || c.site == NULL) /* (the metadata stage) */
        return err;
    acpy_ffi_site *s = c.site;
    if (s->gpu_fallback == NULL)
        return acpy_ffi_fail(cf, XLA_FFI_Error_Code_FAILED_PRECONDITION,
                             "aioccl: this custom call's site was lowered for the CPU, not a GPU");
    XLA_FFI_Stream_Get_Args sa;
    memset(&sa, 0, sizeof sa);
    sa.struct_size = XLA_FFI_Stream_Get_Args_STRUCT_SIZE;
    sa.ctx = cf->ctx;
    if ((err = cf->api->XLA_FFI_Stream_Get(&sa)) != NULL)
        return err;
    XLA_FFI_Buffer *in = c.nin ? c.ins[0] : NULL, *out = c.nout ? c.outs[0] : NULL;
    char msg[2048] = "";
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = learnt(s, in, out, sa.stream);
    if (rc == 1)
        __atomic_fetch_add(&acpy_ffi_calls_native, 1, __ATOMIC_RELAXED);
    else if (rc == 0)
        rc = fallback(s, &c, sa.stream);
    if (rc < 0) {
        PyObject *exc = acpy_ffi_take_exception();
        acpy_ffi_error_text(exc, msg, sizeof msg);
        Py_XDECREF(exc);
    }
    PyGILState_Release(g);
    return *msg ? acpy_ffi_fail(cf, XLA_FFI_Error_Code_INTERNAL, msg) : NULL;
}

ACPY_FFI_HANDLERS(g_, HANDLERS)

/* -- the Python side, with the GIL ------------------------------------------------------------------------ */
/* ffi_gpu_handlers(): {op name: the capsule of its CUDA handler}, for the targets ffi_handlers named */
static PyObject *ffi_gpu_handlers(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(ignored)) {
    PyObject *d = PyDict_New();
    for (int k = 0; d != NULL && k < ACPY_FFI_KINDS; k++) {
        if (acpy_ffi_kind_names[k] == NULL)
            continue;
        PyObject *cap = PyCapsule_New((void *)HANDLERS[k], NULL, NULL);
        if (cap == NULL || PyDict_SetItem(d, acpy_ffi_kind_names[k], cap) < 0)
            Py_CLEAR(d);
        Py_XDECREF(cap);
    }
    return d;
}

/* ffi_gpu_learn(index, pos, gpu_lane, key, entry): the member at pos launches `entry` (plan, name, desc,
 * kind, timeout) through gpu_lane for a call whose (in address, out address, in bytes, out bytes, stream)
 * is `key`. A member has one lane; it keeps at most GPU_PLANS_MAX calls (then starts again). */
static PyObject *ffi_gpu_learn(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *index, *lane, *key, *entry;
    int pos;
    if (!PyArg_ParseTuple(args, "OiO!O!O!", &index, &pos, &acpy_GpuLaneType, &lane, &PyTuple_Type, &key,
                          &PyTuple_Type, &entry))
        return NULL;
    acpy_ffi_site *s = acpy_ffi_site_at(index);
    if (s == NULL)
        return NULL;
    if (pos < 0 || pos >= s->nmembers || PyTuple_GET_SIZE(key) != 5 || PyTuple_GET_SIZE(entry) != 5 ||
        !PyObject_TypeCheck(PyTuple_GET_ITEM(entry, 0), &acpy_GpuPlanType) ||
        !PyLong_Check(PyTuple_GET_ITEM(entry, 3)) || !PyFloat_Check(PyTuple_GET_ITEM(entry, 4))) {
        PyErr_SetString(PyExc_ValueError, "ffi_gpu_learn(index, pos in range, gpu_lane, (in, out, in bytes, out "
                                          "bytes, stream), (plan, name, desc, kind: int, timeout: float))");
        return NULL;
    }
    for (int k = 0; k < 5; k++)
        if (!PyLong_Check(PyTuple_GET_ITEM(key, k))) {
            PyErr_SetString(PyExc_ValueError, "ffi_gpu_learn: the key is five integers");
            return NULL;
        }
    acpy_ffi_member *mem = &s->members[pos];
    if (mem->gpu_lane != NULL && mem->gpu_lane != lane) {
        PyErr_SetString(PyExc_ValueError, "ffi_gpu_learn: this member launches through another GPU lane");
        return NULL;
    }
    if (mem->gpu_plans == NULL && (mem->gpu_plans = PyDict_New()) == NULL)
        return NULL;
    if (mem->gpu_lane == NULL)
        mem->gpu_lane = Py_NewRef(lane);
    if (PyDict_GET_SIZE(mem->gpu_plans) >= GPU_PLANS_MAX)
        PyDict_Clear(mem->gpu_plans);
    if (PyDict_SetItem(mem->gpu_plans, key, entry) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef gpu_methods[] = {
    {"ffi_gpu_handlers", ffi_gpu_handlers, METH_NOARGS,
     "ffi_gpu_handlers(): {op: PyCapsule of its CUDA XLA FFI handler} for the targets ffi_handlers named"},
    {"ffi_gpu_learn", ffi_gpu_learn, METH_VARARGS, "ffi_gpu_learn(index, pos, gpu_lane, key, entry)"},
    {NULL, NULL, 0, NULL},
};

int acpy_xla_ffi_gpu_ready(PyObject *m) { return PyModule_AddFunctions(m, gpu_methods); }
