/* The CPU lane's other collectives: a call seen before, from the call to the done Work, in C.
 *
 * The general way (aioccl/collectives.py) checks a call's arguments, chooses its schedule and lowers it to a
 * program; when that ran as one program on the channel, `teach` keeps the call here by its *form*: the
 * collective, reduction and root, each buffer's dtype, shape and writability, and how out lies against x
 * (none, the same memory, disjoint, or one is the other's block `rank`). Every check the general way makes
 * is decided by the form alone, so a later call of the same form is valid without asking Python again:
 * `run` finds its entry, takes the buffers the program reads and writes (x, out, or a fresh array, as the
 * entry says), and runs the program through the lane (acpy_lane_go). A call of an unknown form answers
 * False (the general way runs it and teaches it); a known call that cannot run now (a group open, ops
 * queued, another thread holding the engine) answers None. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL aioccl_native_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include "answers.h"
#include "lane.h"
#include "core/reduce.h"

enum { CALLS = 128, KEY_DIMS = 4 };
/* where a buffer of the program comes from, and what the Work gives back */
enum { FROM_X = 0, FROM_OUT = 1, FROM_FRESH = 2, FROM_NONE = 3 };
enum { GIVES_X = 0, GIVES_OUT = 1, GIVES_NONE = 2, GIVES_FRESH = 3 };
/* how out lies against x */
enum { REL_NO_OUT = 0, REL_SAME, REL_DISJOINT, REL_X_IN_OUT, REL_OUT_IN_X, REL_NO_X };

typedef struct {
    int32_t code, redop, root, rel;
    int32_t type[2], nd[2], writable[2]; /* x, out; type -1: None */
    npy_intp dims[2][KEY_DIMS];
} call_key;

typedef struct {
    call_key key;
    int used, in_from, out_from, gives, dtype;
    PyObject *prog, *name, *desc, *template, *fresh_descr;
    int fresh_nd;
    npy_intp fresh_dims[KEY_DIMS];
} call_entry;

struct acpy_calls {
    call_entry e[CALLS];
};

acpy_calls *acpy_calls_new(void) { return PyMem_Calloc(1, sizeof(acpy_calls)); }

static void entry_clear(call_entry *e) {
    Py_CLEAR(e->prog);
    Py_CLEAR(e->name);
    Py_CLEAR(e->desc);
    Py_CLEAR(e->template);
    Py_CLEAR(e->fresh_descr);
    e->used = 0;
}

void acpy_calls_clear(acpy_calls *c) {
    if (c != NULL)
        for (int k = 0; k < CALLS; k++)
            entry_clear(&c->e[k]);
}

void acpy_calls_free(acpy_calls *c) {
    acpy_calls_clear(c);
    PyMem_Free(c);
}

int acpy_calls_traverse(acpy_calls *c, visitproc visit, void *arg) {
    if (c == NULL)
        return 0;
    for (int k = 0; k < CALLS; k++) {
        call_entry *e = &c->e[k];
        Py_VISIT(e->prog);
        Py_VISIT(e->name);
        Py_VISIT(e->desc);
        Py_VISIT(e->template);
        Py_VISIT(e->fresh_descr);
    }
    return 0;
}

/* -- a call's form ------------------------------------------------------------------------------------ */
typedef struct {
    char *data;
    size_t nbytes;
} span;

/* buffer j (0 x, 1 out) of the key: 0, or -1 when the lane does not take it (not an exact, aligned, C-ordered
 * numpy array in native byte order with at most KEY_DIMS dimensions) */
static int describe(PyObject *a, call_key *k, int j, span *sp) {
    if (a == Py_None) {
        k->type[j] = -1;
        sp->data = NULL;
        sp->nbytes = 0;
        return 0;
    }
    if (!PyArray_CheckExact(a))
        return -1;
    PyArrayObject *arr = (PyArrayObject *)a;
    int nd = PyArray_NDIM(arr);
    if (nd > KEY_DIMS || !PyArray_CHKFLAGS(arr, NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED) ||
        !PyArray_ISNBO(PyArray_DESCR(arr)->byteorder))
        return -1;
    k->type[j] = PyArray_TYPE(arr);
    k->nd[j] = nd;
    k->writable[j] = PyArray_ISWRITEABLE(arr);
    memcpy(k->dims[j], PyArray_DIMS(arr), (size_t)nd * sizeof(npy_intp));
    sp->data = PyArray_DATA(arr);
    sp->nbytes = (size_t)PyArray_NBYTES(arr);
    return 0;
}

/* how out lies against x; -1: partly overlapping otherwise (the general way refuses it, or copies) */
static int relation(span x, span o, int rank, int size) {
    if (o.data == NULL)
        return REL_NO_OUT;
    if (x.data == NULL)
        return REL_NO_X;
    if (x.data == o.data && x.nbytes == o.nbytes)
        return REL_SAME;
    if (x.data + x.nbytes <= o.data || o.data + o.nbytes <= x.data)
        return REL_DISJOINT;
    if (x.nbytes * (size_t)size == o.nbytes && x.data == o.data + (size_t)rank * x.nbytes)
        return REL_X_IN_OUT;
    if (o.nbytes * (size_t)size == x.nbytes && o.data == x.data + (size_t)rank * o.nbytes)
        return REL_OUT_IN_X;
    return -1;
}

/* the key of (code, x, out, op, root): 0, or -1 when the lane does not take the call */
static int make_key(Lane *self, PyObject *const *args, call_key *k, span *x, span *o) {
    memset(k, 0, sizeof *k); /* (padding too: keys are compared as bytes) */
    int overflow = 0;
    long code = PyLong_AsLongAndOverflow(args[0], &overflow), root = PyLong_AsLongAndOverflow(args[4], &overflow);
    if (PyErr_Occurred() || overflow || !PyLong_CheckExact(args[4]) || code < 0 || code > 1000 ||
        root < -AC_MAX_RANKS || root > AC_MAX_RANKS) {
        PyErr_Clear();
        return -1;
    }
    k->code = (int32_t)code;
    k->root = (int32_t)root;
    if (args[3] != Py_None && (k->redop = acpy_lane_redop(self, args[3])) == 0)
        return -1;
    if (describe(args[1], k, 0, x) < 0 || describe(args[2], k, 1, o) < 0)
        return -1;
    ac_chan *ch = &self->chan->ch;
    k->rel = relation(*x, *o, ch->rank, ch->size);
    return k->rel < 0 ? -1 : 0;
}

static call_entry *slot_of(Lane *self, const call_key *k) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a over the key's bytes */
    const unsigned char *b = (const unsigned char *)k;
    for (size_t i = 0; i < sizeof *k; i++)
        h = (h ^ b[i]) * 1099511628211ULL;
    return &self->calls->e[h % CALLS];
}

/* -- teach ---------------------------------------------------------------------------------------------- */
/* teach(code, x, out, op, root, (program, name, desc, template, in_from, out_from, gives, dtype, fresh)):
 * `run` takes calls of this form from now on. fresh: the array the general way made for OUT (the entry
 * keeps its dtype and shape, not the array), or None. Returns whether the lane took the form. */
PyObject *acpy_lane_teach(Lane *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *t = nargs == 6 ? args[5] : NULL;
    if (t == NULL || !PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 9 ||
        !PyObject_TypeCheck(PyTuple_GET_ITEM(t, 0), &acpy_ProgramType) ||
        !PyUnicode_Check(PyTuple_GET_ITEM(t, 1))) {
        PyErr_SetString(PyExc_TypeError, "teach(code, x, out, op, root, (program, name, desc, template, in_from, "
                                         "out_from, gives, dtype, fresh))");
        return NULL;
    }
    int v[4];
    for (int j = 0; j < 4; j++) {
        long n = PyLong_AsLong(PyTuple_GET_ITEM(t, 4 + j));
        if (n == -1 && PyErr_Occurred())
            return NULL;
        v[j] = (int)n;
    }
    PyObject *fresh = PyTuple_GET_ITEM(t, 8);
    int needs_fresh = v[1] == FROM_FRESH || v[2] == GIVES_FRESH;
    if (v[0] < 0 || v[0] > FROM_NONE || v[0] == FROM_FRESH || v[1] < 0 || v[1] > FROM_NONE || v[2] < 0 ||
        v[2] > GIVES_FRESH || (v[3] != 0 && ac_itemsize(v[3]) == 0) ||
        (needs_fresh && (!PyArray_CheckExact(fresh) || PyArray_NDIM((PyArrayObject *)fresh) > KEY_DIMS))) {
        PyErr_SetString(PyExc_ValueError, "teach: a buffer's source, the result or the dtype code is out of range");
        return NULL;
    }
    call_key k;
    span x, o;
    if (self->chan == NULL || self->calls == NULL || make_key(self, args, &k, &x, &o) < 0 ||
        (v[0] == FROM_X && k.type[0] < 0) || (v[0] == FROM_OUT && k.type[1] < 0) ||
        (v[1] == FROM_X && k.type[0] < 0) || (v[1] == FROM_OUT && k.type[1] < 0))
        Py_RETURN_FALSE;
    call_entry *e = slot_of(self, &k);
    entry_clear(e);
    e->key = k;
    e->in_from = v[0];
    e->out_from = v[1];
    e->gives = v[2];
    e->dtype = v[3];
    e->prog = Py_NewRef(PyTuple_GET_ITEM(t, 0));
    e->name = Py_NewRef(PyTuple_GET_ITEM(t, 1));
    e->desc = Py_NewRef(PyTuple_GET_ITEM(t, 2));
    e->template = Py_NewRef(PyTuple_GET_ITEM(t, 3));
    if (needs_fresh) {
        PyArrayObject *f = (PyArrayObject *)fresh;
        e->fresh_descr = Py_NewRef((PyObject *)PyArray_DESCR(f));
        e->fresh_nd = PyArray_NDIM(f);
        memcpy(e->fresh_dims, PyArray_DIMS(f), (size_t)e->fresh_nd * sizeof(npy_intp));
    }
    e->used = 1;
    Py_RETURN_TRUE;
}

/* -- run -------------------------------------------------------------------------------------------------- */
static PyObject *pick(int from, PyObject *x, PyObject *out, PyObject *fresh) {
    return from == FROM_X ? x : from == FROM_OUT ? out : from == FROM_FRESH ? fresh : Py_None;
}

/* run(code, x, out, op, root[, gx, gout]): the done Work of a call of a form learnt before; a Handover when it
 * must wait (the engine carries it on); else a Declined (answers.h): Declined('form') for a form the lane does
 * not know yet (the general way, which then teaches it). gx, gout: what the Work gives back for x and out (the
 * tensors that x and out view), by default x and out. */
PyObject *acpy_lane_run(Lane *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 && nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "run(code, x, out, op, root[, gx, gout])");
        return NULL;
    }
    if (!__atomic_load_n(&self->enabled, __ATOMIC_ACQUIRE) || self->chan == NULL || self->calls == NULL)
        return acpy_declined(ACPY_NO_OFF);
    if (acpy_lane_learning) /* jax_ext learning what an op runs: the general way must build it */
        return acpy_declined(ACPY_NO_LEARNING);
    call_key k;
    span x, o;
    if (make_key(self, args, &k, &x, &o) < 0)
        return acpy_declined(ACPY_NO_BUFFERS);
    call_entry *e = slot_of(self, &k);
    if (!e->used || memcmp(&e->key, &k, sizeof k) != 0)
        return acpy_declined(ACPY_NO_FORM);
    int open = acpy_work_no_group(self->group_var);
    if (open <= 0)
        return open < 0 ? NULL : acpy_declined(ACPY_NO_GROUP);
    PyObject *fresh = NULL;
    if (e->fresh_descr != NULL) {
        Py_INCREF(e->fresh_descr); /* (PyArray_Empty steals it) */
        fresh = PyArray_Empty(e->fresh_nd, e->fresh_dims, (PyArray_Descr *)e->fresh_descr, 0);
        if (fresh == NULL)
            return NULL;
    }
    PyObject *in_obj = pick(e->in_from, args[1], args[2], fresh), *out_obj = pick(e->out_from, args[1], args[2], fresh);
    void *in = in_obj == Py_None ? NULL : PyArray_DATA((PyArrayObject *)in_obj);
    void *out = out_obj == Py_None ? NULL : PyArray_DATA((PyArrayObject *)out_obj);
    size_t in_len = in_obj == Py_None ? 0 : (size_t)PyArray_NBYTES((PyArrayObject *)in_obj);
    size_t out_len = out_obj == Py_None ? 0 : (size_t)PyArray_NBYTES((PyArrayObject *)out_obj);
    Program *prog = (Program *)e->prog;
    size_t item = e->dtype ? ac_itemsize(e->dtype) : 1;
    if ((uint64_t)prog->words[8] * item > in_len || (uint64_t)prog->words[9] * item > out_len) {
        Py_XDECREF(fresh); /* (the general way refuses it the same way: never here for a form it taught) */
        return acpy_declined(ACPY_NO_SIZE);
    }
    PyObject *entry_refs[3] = {Py_NewRef(e->prog), Py_NewRef(e->name), Py_NewRef(e->desc)};
    PyObject *template = Py_NewRef(e->template);
    int redop = k.redop, gives = e->gives, dtype = e->dtype;
    long long seq;
    int64_t order;
    int rc;
    double t0;
    /* (the entry may be replaced while the GIL is released: its objects are held here) */
    int went = acpy_lane_go(self, entry_refs[0], in, in_len, out, out_len, dtype, redop, in_obj, out_obj, &seq,
                            &order, &rc, &t0);
    PyObject *gx = nargs == 7 ? args[5] : args[1], *gout = nargs == 7 ? args[6] : args[2];
    PyObject *give = gives == GIVES_X ? gx : gives == GIVES_OUT ? gout : gives == GIVES_FRESH ? fresh : Py_None;
    PyObject *result = NULL;
    if (went == 0)
        result = acpy_declined(ACPY_NO_BUSY);
    else if (went == 2) {
        Py_XSETREF(self->pending, acpy_handover(template, in_obj, out_obj, Py_None, rc, seq, (long long)order, give));
        result = self->pending ? Py_NewRef(self->pending) : NULL;
    } else if (went == 1) {
        self->ran++;
        result = acpy_work_born_done(&self->wm, entry_refs[1], seq, give, entry_refs[2], t0);
        if (result != NULL && acpy_work_record(self->record, entry_refs[1], seq, entry_refs[2], t0) < 0)
            Py_CLEAR(result);
    }
    for (int j = 0; j < 3; j++)
        Py_DECREF(entry_refs[j]);
    Py_DECREF(template);
    Py_XDECREF(fresh);
    return result;
}
