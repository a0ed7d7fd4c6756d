/* Awaiting a Work that is already done, in C (awaiting.h).
 *
 * Why: an op the native core finished inside the call is done before its caller awaits it, and the Python
 * __await__ that hands back the result cost 0.7-0.9 us (a frame, five lookups, a generator and the
 * StopIteration that ends it): a quarter of a 64 B op. Here the Work's base class, Awaiting, answers
 * `await` from the Work's slots with an iterator whose am_send returns the result at once (no exception
 * is made); anything else (not done, failed, its loop owed a turn, no asyncio loop) goes to the Work's
 * Python `_await`, which decides as it always did.
 *
 * The fairness rule is aioccl/work.py's: an await returns without suspending only while this thread's
 * asyncio loop had a turn through one of our awaits within FAIRNESS_S. When that turn was is this
 * thread's clock here (CLOCK_MONOTONIC: time.monotonic()'s), set by `loop_turned()` in the slow path. */
#include "awaiting.h"

#include <structmember.h> /* PyMemberDescrObject: the slots' offsets */
#include <time.h>

enum { S_STATE, S_EXC, S_RESULT, S_RETRIEVED, N_SLOTS };
static const char *const SLOT_NAMES[N_SLOTS] = {"_state", "_exc", "_result", "_retrieved"};
enum { STATE_DONE = 2 }; /* work.py's _DONE */

static struct {
    PyTypeObject *type;         /* the Work class these offsets are of (NULL: every await takes _await) */
    Py_ssize_t off[N_SLOTS];
    double fairness_s;
    PyObject *running_loop;     /* asyncio._get_running_loop */
} conf;
static PyObject *s_await;       /* "_await", interned */
static _Thread_local double turned; /* when this thread's loop last had a turn through our await */

static double monotonic(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static PyObject *slot(PyObject *w, int k) { return *(PyObject **)((char *)w + conf.off[k]); }

/* -- Given: the iterator of a result already there ---------------------------------------------- */
typedef struct {
    PyObject_HEAD
    PyObject *value; /* NULL once given */
} Given;

static PyTypeObject GivenType;

static PySendResult given_send(PyObject *self, PyObject *Py_UNUSED(arg), PyObject **result) {
    Given *g = (Given *)self;
    if (g->value == NULL) {  /* as a finished generator: nothing more */
        *result = Py_NewRef(Py_None);
        return PYGEN_RETURN;
    }
    *result = g->value;  /* (its reference moves to the caller) */
    g->value = NULL;
    return PYGEN_RETURN;
}

static PyObject *stop(PyObject *value) {  /* StopIteration(value) raised, for callers that iterate */
    PyObject *e = PyObject_CallOneArg(PyExc_StopIteration, value);
    if (e != NULL) {
        PyErr_SetObject(PyExc_StopIteration, e);
        Py_DECREF(e);
    }
    Py_DECREF(value);
    return NULL;
}

static PyObject *given_next(PyObject *self) {
    PyObject *v;
    given_send(self, Py_None, &v);
    return stop(v);
}

static PyObject *given_send_method(PyObject *self, PyObject *arg) {
    PyObject *v;
    given_send(self, arg, &v);
    return stop(v);
}

static PyObject *given_throw(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Given *g = (Given *)self;
    Py_CLEAR(g->value);
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "throw(exception[, value[, traceback]])");
        return NULL;
    }
    PyObject *e = args[0];
    if (PyType_Check(e) && PyType_IsSubtype((PyTypeObject *)e, (PyTypeObject *)PyExc_BaseException))
        PyErr_SetObject(e, nargs > 1 ? args[1] : Py_None);
    else if (PyExceptionInstance_Check(e))
        PyErr_SetObject((PyObject *)Py_TYPE(e), e);
    else
        PyErr_SetString(PyExc_TypeError, "exceptions must derive from BaseException");
    return NULL;
}

static PyObject *given_close(PyObject *self, PyObject *Py_UNUSED(a)) {
    Py_CLEAR(((Given *)self)->value);
    Py_RETURN_NONE;
}

static int given_traverse(PyObject *self, visitproc visit, void *arg) {
    Py_VISIT(((Given *)self)->value);
    return 0;
}

static int given_clear(PyObject *self) {
    Py_CLEAR(((Given *)self)->value);
    return 0;
}

static void given_dealloc(PyObject *self) {
    PyObject_GC_UnTrack(self);
    given_clear(self);
    PyObject_GC_Del(self);
}

static PyMethodDef given_methods[] = {
    {"send", given_send_method, METH_O, "send(value): raises StopIteration with the result"},
    {"throw", (PyCFunction)(void (*)(void))given_throw, METH_FASTCALL, "throw(exc): raises it"},
    {"close", given_close, METH_NOARGS, "close()"},
    {NULL, NULL, 0, NULL},
};

static PyAsyncMethods given_async = {.am_send = given_send};

static PyTypeObject GivenType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aioccl.native._core.Given",
    .tp_doc = "The awaitable of a Work already done: gives its result without suspending.",
    .tp_basicsize = sizeof(Given),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_as_async = &given_async,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = given_next,
    .tp_methods = given_methods,
    .tp_traverse = given_traverse,
    .tp_clear = given_clear,
    .tp_dealloc = given_dealloc,
};

/* -- Awaiting: the Work's base ------------------------------------------------------------------- */
static int fast(PyObject *w) {  /* 1: the result can be given now; 0: ask _await; -1: an error */
    if (Py_TYPE(w) != conf.type || conf.running_loop == NULL || turned == 0.0 ||
        monotonic() - turned > conf.fairness_s)
        return 0;
    PyObject *state = slot(w, S_STATE), *exc = slot(w, S_EXC);
    if (state == NULL || !PyLong_CheckExact(state) || PyLong_AsLong(state) < STATE_DONE || exc != Py_None)
        return 0;
    PyObject *loop = PyObject_CallNoArgs(conf.running_loop);  /* (trio, or no loop: the slow path says) */
    if (loop == NULL)
        return -1;
    Py_DECREF(loop);
    return loop != Py_None;
}

static PyObject *awaiting_await(PyObject *self) {
    int now = fast(self);
    if (now < 0)
        return NULL;
    if (!now)
        return PyObject_CallMethodNoArgs(self, s_await);
    Given *g = PyObject_GC_New(Given, &GivenType);
    if (g == NULL)
        return NULL;
    PyObject *result = slot(self, S_RESULT);
    g->value = Py_NewRef(result != NULL ? result : Py_None);
    PyObject_GC_Track(g);
    PyObject **retrieved = (PyObject **)((char *)self + conf.off[S_RETRIEVED]);
    Py_XSETREF(*retrieved, Py_NewRef(Py_True));
    return (PyObject *)g;
}

static PyAsyncMethods awaiting_async = {.am_await = awaiting_await};

static PyTypeObject AwaitingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aioccl.native._core.Awaiting",
    .tp_doc = "The base of aioccl.work.Work: `await` of a Work already done, in C (awaiting.c).",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_as_async = &awaiting_async,
    .tp_new = PyType_GenericNew,
};

/* awaiting_setup(work_type, fairness_s, running_loop): the Work class whose slots the fast path reads */
static PyObject *awaiting_setup(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *type, *running_loop;
    double fairness;
    if (!PyArg_ParseTuple(args, "O!dO", &PyType_Type, &type, &fairness, &running_loop))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)type, &AwaitingType) || !PyCallable_Check(running_loop)) {
        PyErr_SetString(PyExc_TypeError, "awaiting_setup(a subclass of Awaiting, seconds, a callable)");
        return NULL;
    }
    Py_ssize_t off[N_SLOTS];
    for (int k = 0; k < N_SLOTS; k++) {
        PyObject *d = PyDict_GetItemString(((PyTypeObject *)type)->tp_dict, SLOT_NAMES[k]);
        if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type) ||
            ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) {
            PyErr_Format(PyExc_TypeError, "%s has no slot %s", ((PyTypeObject *)type)->tp_name, SLOT_NAMES[k]);
            return NULL;
        }
        off[k] = ((PyMemberDescrObject *)d)->d_member->offset;
    }
    memcpy(conf.off, off, sizeof off);
    conf.fairness_s = fairness;
    Py_XSETREF(conf.running_loop, Py_NewRef(running_loop));
    Py_XSETREF(conf.type, (PyTypeObject *)Py_NewRef(type));
    Py_RETURN_NONE;
}

static PyObject *loop_turned(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(a)) {
    turned = monotonic();
    Py_RETURN_NONE;
}

static PyObject *last_turn(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(a)) { return PyFloat_FromDouble(turned); }

static PyMethodDef functions[] = {
    {"awaiting_setup", awaiting_setup, METH_VARARGS,
     "awaiting_setup(work_type, fairness_s, running_loop): the Work class Awaiting's fast path reads"},
    {"loop_turned", loop_turned, METH_NOARGS, "loop_turned(): this thread's loop has a turn now"},
    {"last_turn", last_turn, METH_NOARGS, "last_turn(): when this thread's loop last had one (monotonic s)"},
    {NULL, NULL, 0, NULL},
};

int acpy_awaiting_ready(PyObject *m) {
    if ((s_await = PyUnicode_InternFromString("_await")) == NULL || PyType_Ready(&GivenType) < 0 ||
        PyType_Ready(&AwaitingType) < 0 || PyModule_AddObjectRef(m, "Awaiting", (PyObject *)&AwaitingType) < 0)
        return -1;
    for (PyMethodDef *f = functions; f->ml_name != NULL; f++) {
        PyObject *fn = PyCFunction_New(f, NULL);
        if (fn == NULL || PyModule_AddObject(m, f->ml_name, fn) < 0) {
            Py_XDECREF(fn);
            return -1;
        }
    }
    return 0;
}
