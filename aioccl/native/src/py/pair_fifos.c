/* Where a pair's two FIFOs lie, looked up once per connection (pair_lane_object.h).
 *
 * Why: each send and receive looked up the connection's ByteFifo, its two memoryviews, and took and gave
 * back a buffer of each: a dozen calls into CPython per op, a tenth of an 8-byte exchange's instructions.
 * The addresses do not change while the connection lives: its FIFOs stay mapped until ShmPairConnection._shut,
 * which marks it closed first, and every lane call looks at `closed` before it touches a FIFO (acpy_pair_check;
 * the engine is held for the call, so the connection cannot end during it). The cache keeps a reference to
 * the connection it describes, so a new connection to the same peer (never at the same address as a live
 * object) is looked up afresh; no buffer stays exported, so closing is never refused. */
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL aioccl_native_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include "pair_lane_object.h"

static PyObject *s_tx, *s_rx, *s_ctl, *s_data;

/* the FIFO behind a ByteFifo (its ctl and data memoryviews, checked as core/fifo.h needs them): 1, or 0 */
static int locate(PyObject *conn, PyObject *name, ac_fifo *f) {
    PyObject *fifo = PyObject_GetAttr(conn, name);
    PyObject *ctl = fifo ? PyObject_GetAttr(fifo, s_ctl) : NULL, *data = fifo ? PyObject_GetAttr(fifo, s_data) : NULL;
    Py_buffer bc, bd;
    int ok = 0;
    if (ctl != NULL && data != NULL && PyObject_GetBuffer(ctl, &bc, PyBUF_SIMPLE) == 0) {
        if (PyObject_GetBuffer(data, &bd, PyBUF_WRITABLE) == 0) {
            ok = bc.len >= AC_FIFO_CTRL_BYTES && bd.len >= 64 && bd.len % 64 == 0 && (uintptr_t)bc.buf % 8 == 0;
            *f = (ac_fifo){.ctl = bc.buf, .data = bd.buf, .cap = (uint64_t)bd.len};
            PyBuffer_Release(&bd);
        }
        PyBuffer_Release(&bc);
    }
    PyErr_Clear();
    Py_XDECREF(fifo);
    Py_XDECREF(ctl);
    Py_XDECREF(data);
    return ok;
}

int acpy_pair_fifos(PairLane *self, const call *c, ac_fifo *tx, ac_fifo *rx) {
    pair_fifos *p = &self->fifos[c->peer];
    if (p->conn != c->conn) {
        Py_CLEAR(p->conn);
        if (!locate(c->conn, s_tx, &p->tx) || !locate(c->conn, s_rx, &p->rx))
            return 0;
        p->conn = Py_NewRef(c->conn);
    }
    if (tx != NULL)
        *tx = p->tx;
    if (rx != NULL)
        *rx = p->rx;
    return 1;
}

int acpy_pair_fifos_ready(void) {
    struct { PyObject **at; const char *s; } names[] = {
        {&s_tx, "tx"}, {&s_rx, "rx"}, {&s_ctl, "ctl"}, {&s_data, "data"},
    };
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if (*names[k].at == NULL && (*names[k].at = PyUnicode_InternFromString(names[k].s)) == NULL)
            return -1;
    return 0;
}
