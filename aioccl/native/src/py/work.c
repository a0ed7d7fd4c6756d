/* A Work born done, made in C (work.h). */
#include "work.h"

#include <structmember.h> /* PyMemberDescrObject: the slots' offsets */
#include <time.h>

static const char *const SLOTS[ACPY_WORK_N_SLOTS] = {
    "op", "seq", "_lock", "_state", "_result", "_exc", "_callbacks", "_event", "_cancellable", "_on_cancel",
    "_engine_thread", "_t0", "_desc", "_probe", "event", "_next_warn", "_retrieved", "status", "_withdraw", "_home",
};
enum { WORK_DONE = 2, SLOT_CALLBACKS = 6 };

int acpy_work_maker_init(acpy_work_maker *m, PyObject *type, PyObject *done_lock, PyObject *home, unsigned long thread_id) {
    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "the Work type must be a class");
        return -1;
    }
    PyObject *dict = ((PyTypeObject *)type)->tp_dict;
    /* the same slots as work.py's Work, no more: one it adds that this file does not set is refused here,
     * when a lane is made, not left unset in every Work born done */
    PyObject *declared = PyDict_GetItemString(dict, "__slots__");
    if (declared == NULL || !PyTuple_Check(declared) || PyTuple_GET_SIZE(declared) != ACPY_WORK_N_SLOTS) {
        PyErr_Format(PyExc_TypeError, "Work's __slots__ must be a tuple of the %d slots the native core sets",
                     ACPY_WORK_N_SLOTS);
        return -1;
    }
    for (int k = 0; k < ACPY_WORK_N_SLOTS; k++) {
        PyObject *d = PyDict_GetItemString(dict, SLOTS[k]);
        if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type)) {
            PyErr_Format(PyExc_TypeError, "Work has no slot %s", SLOTS[k]);
            return -1;
        }
        m->off[k] = ((PyMemberDescrObject *)d)->d_member->offset;
    }
    PyObject *thread = PyLong_FromUnsignedLong(thread_id);
    if (thread == NULL)
        return -1;
    Py_XSETREF(m->type, Py_NewRef(type));
    Py_XSETREF(m->done_lock, Py_NewRef(done_lock));
    Py_XSETREF(m->home, Py_NewRef(home));
    Py_XSETREF(m->engine_thread, thread);
    Py_CLEAR(m->spare);
    return 0;
}

int acpy_work_maker_traverse(acpy_work_maker *m, visitproc visit, void *arg) {
    Py_VISIT(m->type);
    Py_VISIT(m->done_lock);
    Py_VISIT(m->home);
    Py_VISIT(m->engine_thread);
    Py_VISIT(m->spare);
    return 0;
}

void acpy_work_maker_clear(acpy_work_maker *m) {
    Py_CLEAR(m->type);
    Py_CLEAR(m->done_lock);
    Py_CLEAR(m->home);
    Py_CLEAR(m->engine_thread);
    Py_CLEAR(m->spare);
}

void acpy_work_set(const acpy_work_maker *m, PyObject *w, int slot, PyObject *v) {
    PyObject **at = (PyObject **)((char *)w + m->off[slot]);
    Py_XSETREF(*at, v);
}

/* Why a spare: allocating a Work's 20 slots and freeing them again was a sixth of an 8-byte send's
 * instructions. The last Work made is kept; when the next op finds that nothing else holds it (its
 * reference count is the maker's one: whoever awaited it let go, and nobody can reach it, since Work has no
 * __weakref__ slot), it is made again in place: every slot set anew, as a fresh one would be. An op whose
 * Work is still held gets a new one, which becomes the spare. The price: the spare keeps its op's result (a
 * host array the caller passed in) alive until the lane's next op, so only the host lanes ask for it
 * (`recycle`). */
PyObject *acpy_work_born_done(acpy_work_maker *m, PyObject *name, long long seq, PyObject *result, PyObject *desc,
                         double t0) {
    if (m->type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the Work maker is not set up");
        return NULL;
    }
    PyObject *w = m->spare, *callbacks = NULL;
    if (w != NULL && m->recycle && Py_REFCNT(w) == 1) {
        Py_INCREF(w);
        /* a done Work's callbacks stay empty (_on_done calls at once): the list serves again */
        callbacks = *(PyObject **)((char *)w + m->off[SLOT_CALLBACKS]);
        callbacks = callbacks != NULL && PyList_CheckExact(callbacks) && !PyList_GET_SIZE(callbacks) ?
                    Py_NewRef(callbacks) : NULL;
    } else {
        PyTypeObject *t = (PyTypeObject *)m->type;
        if ((w = t->tp_alloc(t, 0)) == NULL)
            return NULL;
        if (m->recycle)
            Py_XSETREF(m->spare, Py_NewRef(w));
    }
    PyObject *vals[ACPY_WORK_N_SLOTS] = {
        Py_NewRef(name), PyLong_FromLongLong(seq), Py_NewRef(m->done_lock), PyLong_FromLong(WORK_DONE),
        Py_NewRef(result), Py_NewRef(Py_None), callbacks ? callbacks : PyList_New(0), Py_NewRef(Py_None),
        Py_NewRef(Py_False), Py_NewRef(Py_None), Py_NewRef(m->engine_thread), PyFloat_FromDouble(t0), Py_NewRef(desc),
        Py_NewRef(Py_None), Py_NewRef(Py_None), PyFloat_FromDouble(0.0), Py_NewRef(Py_False), Py_NewRef(Py_None),
        Py_NewRef(Py_False), Py_NewRef(m->home),
    };
    int ok = 1;
    for (int k = 0; k < ACPY_WORK_N_SLOTS; k++) {
        ok &= vals[k] != NULL;
        acpy_work_set(m, w, k, vals[k]);
    }
    if (!ok) {
        Py_DECREF(w);
        return NULL;
    }
    return w;
}

int acpy_work_record(PyObject *record, PyObject *name, long long seq, PyObject *desc, double t0) {
    /* (op, seq, desc, exc, took), as FlightRecorder.add makes it; built item by item (a format string
     * costs more than the rest of the entry) */
    PyObject *entry = PyTuple_New(5), *s = PyLong_FromLongLong(seq), *took = PyFloat_FromDouble(acpy_work_monotonic() - t0);
    if (entry == NULL || s == NULL || took == NULL) {
        Py_XDECREF(entry);
        Py_XDECREF(s);
        Py_XDECREF(took);
        return -1;
    }
    PyTuple_SET_ITEM(entry, 0, Py_NewRef(name));
    PyTuple_SET_ITEM(entry, 1, s);
    PyTuple_SET_ITEM(entry, 2, Py_NewRef(desc));
    PyTuple_SET_ITEM(entry, 3, Py_NewRef(Py_None));
    PyTuple_SET_ITEM(entry, 4, took);
    PyObject *r = PyObject_CallOneArg(record, entry);
    Py_DECREF(entry);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

double acpy_work_monotonic(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int acpy_work_no_group(PyObject *group_var) {
    PyObject *group = NULL;
    if (PyContextVar_Get(group_var, Py_None, &group) < 0)
        return -1;
    int in_group = group != Py_None;
    Py_DECREF(group);
    return !in_group;
}
