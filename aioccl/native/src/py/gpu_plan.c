/* GpuPlan: an op's launches, packed once from what aioccl/gpu/lane.py's plan() gives (function, grid,
 * threads, 8-byte argument slots, the epoch's slot), so the GPU lane (gpu_lane.c) launches them without
 * reading a Python object. */
#include "gpu_plan.h"

#include <string.h>

static int parse_launch(PyObject *spec, ac_launch *out) {
    PyObject *fn;
    Py_buffer args;
    if (!PyArg_ParseTuple(spec, "OIIy*i", &fn, &out->grid, &out->threads, &args, &out->epoch_at))
        return -1;
    int ok = args.len % 8 == 0 && args.len / 8 <= AC_MAX_ARGS && out->grid > 0 && out->threads > 0;
    out->nargs = (int)(args.len / 8);
    ok = ok && out->epoch_at >= 0 && out->epoch_at < out->nargs;
    if (ok) {
        memcpy(out->slots, args.buf, (size_t)args.len);
        for (int k = 0; k < out->nargs; k++)
            out->params[k] = &out->slots[k];
        out->fn = PyLong_AsVoidPtr(fn);
        ok = !PyErr_Occurred() && out->fn != NULL;
    }
    PyBuffer_Release(&args);
    if (!ok && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "GpuPlan: a launch is (function, grid, threads, 8-byte argument slots "
                                          "(at most 32), the epoch's slot)");
    return ok ? 0 : -1;
}

/* GpuPlan(pieces): pieces a tuple of (launch,) (spin form) or (publish, consume) (stream form) */
static PyObject *GpuPlan_new(PyTypeObject *type, PyObject *args, PyObject *Py_UNUSED(kwds)) {
    PyObject *pieces;
    if (!PyArg_ParseTuple(args, "O!", &PyTuple_Type, &pieces))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(pieces);
    if (n < 1 || n > 1 << 20) {
        PyErr_SetString(PyExc_ValueError, "GpuPlan: at least one piece");
        return NULL;
    }
    PyObject *first = PyTuple_GET_ITEM(pieces, 0);
    Py_ssize_t per = PyTuple_Check(first) ? PyTuple_GET_SIZE(first) : 0;
    if (per != 1 && per != 2) {
        PyErr_SetString(PyExc_ValueError, "GpuPlan: a piece is (launch,) or (publish, consume)");
        return NULL;
    }
    GpuPlan *self = (GpuPlan *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->p.npieces = (int)n;
    self->p.stream_form = per == 2;
    self->p.l = PyMem_Calloc((size_t)(n * per), sizeof(ac_launch));
    if (self->p.l == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *piece = PyTuple_GET_ITEM(pieces, k);
        if (!PyTuple_Check(piece) || PyTuple_GET_SIZE(piece) != per) {
            PyErr_SetString(PyExc_ValueError, "GpuPlan: every piece has the same form");
            Py_DECREF(self);
            return NULL;
        }
        for (Py_ssize_t j = 0; j < per; j++)
            if (parse_launch(PyTuple_GET_ITEM(piece, j), &self->p.l[k * per + j]) < 0) {
                Py_DECREF(self);
                return NULL;
            }
    }
    return (PyObject *)self;
}

static void GpuPlan_dealloc(GpuPlan *self) {
    PyMem_Free(self->p.l);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *GpuPlan_get_pieces(GpuPlan *self, void *Py_UNUSED(c)) { return PyLong_FromLong(self->p.npieces); }

static PyGetSetDef GpuPlan_getset[] = {
    {"pieces", (getter)GpuPlan_get_pieces, NULL, "how many pieces (epochs) the op takes", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject acpy_GpuPlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aioccl.native._core.GpuPlan",
    .tp_basicsize = sizeof(GpuPlan),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "GpuPlan(pieces): one op's kernel launches, arguments packed (gpu_plan.c)",
    .tp_new = GpuPlan_new,
    .tp_dealloc = (destructor)GpuPlan_dealloc,
    .tp_getset = GpuPlan_getset,
};
