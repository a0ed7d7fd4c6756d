/* aioccl.native._core: the module. Each file of this CPython layer (py/) adds its types and functions
 * (its *_ready); this one adds the protocol's constants and the reductions' test entry points. The pure-C
 * layer below (core/) knows nothing of Python. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define PY_ARRAY_UNIQUE_SYMBOL aioccl_native_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include "core/jitter.h"
#include "answers.h"
#include "awaiting.h"
#include "channel_type.h"
#include "core/channel.h"
#include "fast_lane.h"
#include "gpu_lane.h"
#include "pair_lane.h"
#include "core/reduce.h"
#ifdef AIOCCL_XLA_FFI
#include "xla_ffi.h"
#endif

/* -- reductions, for tests ---------------------------------------------------------------------- */
static PyObject *mod_combine(PyObject *Py_UNUSED(m), PyObject *args) {
    int op, dtype;
    Py_buffer d, a, b;
    if (!PyArg_ParseTuple(args, "iiw*y*y*", &op, &dtype, &d, &a, &b))
        return NULL;
    size_t item = ac_itemsize(dtype);
    int rc = -1;
    if (item && d.len == a.len && d.len == b.len && d.len % (Py_ssize_t)item == 0) {
        Py_BEGIN_ALLOW_THREADS
        rc = ac_combine(op, dtype, d.buf, a.buf, b.buf, (size_t)d.len / item);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&d);
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    if (rc != 0) {
        PyErr_SetString(PyExc_ValueError, "combine: unknown op/dtype, or buffers of different sizes");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *mod_scale(PyObject *Py_UNUSED(m), PyObject *args) {
    int dtype;
    long long divisor;
    Py_buffer d;
    if (!PyArg_ParseTuple(args, "iw*L", &dtype, &d, &divisor))
        return NULL;
    size_t item = ac_itemsize(dtype);
    int rc = -1;
    if (item && d.len % (Py_ssize_t)item == 0 && divisor > 0) {
        Py_BEGIN_ALLOW_THREADS
        rc = ac_scale(dtype, d.buf, (size_t)d.len / item, divisor);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&d);
    if (rc != 0) {
        PyErr_SetString(PyExc_ValueError, "scale: not a floating-point dtype");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* jitter() -> (points that yielded or slept, the rate in percent; 0, 0 when AIOCCL_JITTER is unset): the hang
 * hunter checks that its noise is on */
static PyObject *mod_jitter(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(ignored)) {
    return Py_BuildValue("(Ki)", (unsigned long long)ac_jitter_hits(), ac_jitter_on ? (int)ac_jitter_rate() : 0);
}

static PyMethodDef module_methods[] = {
    {"jitter", mod_jitter, METH_NOARGS, "jitter() -> (points jittered, rate %): the hang hunter's noise"},
    {"combine", mod_combine, METH_VARARGS, "combine(op, dtype, dst, a, b): dst = a op b (tests)"},
    {"scale", mod_scale, METH_VARARGS, "scale(dtype, buf, divisor): buf /= divisor (tests)"},
    {"load_cuda", (PyCFunction)(void (*)(void))acpy_gpu_load_cuda, METH_FASTCALL,
     "load_cuda([path]): the CUDA driver's calls for GpuLane, from libcuda.so.1 or a stand-in library"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT, "_core", "aioccl's native core (see aioccl/native/README.md)", -1, module_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__core(void) {
    import_array();
    ac_jitter_init();
    PyObject *m = PyModule_Create(&core_module);
    if (m == NULL)
        return NULL;
#ifdef AIOCCL_XLA_FFI
    if (acpy_xla_ffi_ready(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#endif
    if (acpy_answers_ready(m) < 0 || acpy_awaiting_ready(m) < 0 || acpy_channel_type_ready(m) < 0 || acpy_fast_lane_ready(m) < 0 || acpy_gpu_lane_ready(m) < 0 ||
        acpy_pair_lane_ready(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "BLOCKED", AC_BLOCKED) < 0 ||
        PyModule_AddIntConstant(m, "MISMATCH", AC_MISMATCH) < 0 ||
        PyModule_AddIntConstant(m, "NOT_CLEAN", AC_NOT_CLEAN) < 0 ||
        PyModule_AddIntConstant(m, "CORRUPT", AC_CORRUPT) < 0 ||
        PyModule_AddIntConstant(m, "UNSUITABLE", AC_UNSUITABLE) < 0 ||
        PyModule_AddIntConstant(m, "BELLS", AC_BELLS) < 0 ||
        PyModule_AddIntConstant(m, "PROG_MAGIC", (long)AC_PROG_MAGIC) < 0 ||
        PyModule_AddIntConstant(m, "CODE_BROADCAST", AC_CODE_BROADCAST) < 0 ||
        PyModule_AddIntConstant(m, "CONTROL_BYTES", AC_CONTROL_BYTES) < 0 ||
        PyModule_AddIntConstant(m, "W_CTR", AC_W_CTR) < 0 || PyModule_AddIntConstant(m, "W_SLEEP", AC_W_SLEEP) < 0 ||
        PyModule_AddIntConstant(m, "W_GAVE_UP", AC_W_GAVE_UP) < 0 ||
        PyModule_AddIntConstant(m, "W_DESC", AC_W_DESC) < 0 || PyModule_AddIntConstant(m, "DESC_LEN", AC_DESC_LEN) < 0 ||
        PyModule_AddIntConstant(m, "W_HALF", AC_W_HALF) < 0 || PyModule_AddIntConstant(m, "W_PID", AC_W_PID) < 0 ||
        PyModule_AddIntConstant(m, "W_SELF", AC_W_SELF) < 0 || PyModule_AddIntConstant(m, "W_NONCE", AC_W_NONCE) < 0 || PyModule_AddIntConstant(m, "MAX_RANKS", AC_MAX_RANKS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
