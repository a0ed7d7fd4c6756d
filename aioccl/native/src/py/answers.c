/* A lane's typed answers: a Declined (which reason) or a Handover (the op it started and could not finish in the
 * call), never None, False or a tuple told apart by its length.
 *
 * Both classes are Python's (aioccl/native/answers.py, shared with the lanes that have no C side), given once
 * when the module is loaded (answers_setup). The Declined of each reason is made then, so declining a call
 * allocates nothing: it costs what returning None did. A Handover is made only for an op that must wait, where
 * the engine's hand-over costs far more. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "answers.h"

static const char *const REASONS[ACPY_NO_REASONS] = {
    "off", "buffers", "size", "form", "busy", "group", "learning", "spun", "full", "device", "wildcard",
};
static PyObject *declined[ACPY_NO_REASONS];
static PyObject *handover_type;

PyObject *acpy_declined(acpy_no why) {
    if ((int)why < 0 || why >= ACPY_NO_REASONS || declined[why] == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "aioccl native core: answers_setup() was not called");
        return NULL;
    }
    return Py_NewRef(declined[why]);
}

PyObject *acpy_handover(PyObject *template_, PyObject *inp, PyObject *out, PyObject *op, int rc, long long seq,
                        long long order, PyObject *given) {
    if (handover_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "aioccl native core: answers_setup() was not called");
        return NULL;
    }
    PyObject *nums[3] = {PyLong_FromLong(rc), PyLong_FromLongLong(seq), PyLong_FromLongLong(order)};
    PyObject *h = NULL;
    if (nums[0] && nums[1] && nums[2]) {
        PyObject *args[8] = {template_, inp, out, op, nums[0], nums[1], nums[2], given};
        h = PyObject_Vectorcall(handover_type, args, 8, NULL);
    }
    for (int k = 0; k < 3; k++)
        Py_XDECREF(nums[k]);
    return h;
}

/* answers_setup(declined_type, handover_type): the Declined of each reason, made once; the reasons' names */
static PyObject *answers_setup(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyType_Check(args[0]) || !PyType_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "answers_setup(Declined, Handover)");
        return NULL;
    }
    PyObject *names = PyTuple_New(ACPY_NO_REASONS);
    if (names == NULL)
        return NULL;
    for (int k = 0; k < ACPY_NO_REASONS; k++) {
        PyObject *name = PyUnicode_InternFromString(REASONS[k]);
        PyObject *d = name ? PyObject_CallOneArg(args[0], name) : NULL;
        if (d == NULL) {
            Py_XDECREF(name);
            Py_DECREF(names);
            return NULL;
        }
        PyTuple_SET_ITEM(names, k, name);
        Py_XSETREF(declined[k], d);
    }
    Py_XSETREF(handover_type, Py_NewRef(args[1]));
    return names;
}

static PyMethodDef setup_def = {"answers_setup", (PyCFunction)(void (*)(void))answers_setup, METH_FASTCALL,
                                "answers_setup(Declined, Handover): the lanes' answers (answers.h); the reasons"};

int acpy_answers_ready(PyObject *m) {
    PyObject *fn = PyCFunction_New(&setup_def, NULL);
    if (fn == NULL || PyModule_AddObject(m, "answers_setup", fn) < 0) {
        Py_XDECREF(fn);
        return -1;
    }
    return 0;
}
