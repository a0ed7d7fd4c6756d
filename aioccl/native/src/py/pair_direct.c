/* The point-to-point lane's single copy (pair_lane_object.h): a send from DIRECT_MIN bytes whose receive
 * waits in the peer's lane and announced its buffer (the FIFO's want, core/fifo.h) writes the payload
 * straight into that buffer by cross-memory attach (core/cma.h), and pair_lane.c puts a header-only frame
 * marked delivered instead of the message. Why: through the FIFO a message is copied twice (in, then out),
 * where Open MPI copies a large one once; a 1 MiB ping-pong went from 1.28x Open MPI's time to 1.07x.
 *
 * Where the kernel refuses (another user, Yama's ptrace scope: conn.memory is None) or no receive waits
 * for this message, the message goes through the FIFO as before. */
#include <sched.h>
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL aioccl_native_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include "core/cma.h"
#include "pair_lane_object.h"

/* The peer's pid when this rank may write its memory (conn.memory: cross-memory attach proved), else 0 (two
 * lookups by name: a message this large takes tens of microseconds to copy) */
static int32_t peer_pid(PyObject *conn) {
    PyObject *mem = PyObject_GetAttrString(conn, "memory");
    PyObject *pid = mem != NULL && mem != Py_None ? PyObject_GetAttrString(mem, "pid") : NULL;
    long v = pid != NULL ? PyLong_AsLong(pid) : 0;
    Py_XDECREF(mem);
    Py_XDECREF(pid);
    PyErr_Clear();
    return v > 0 && v < INT32_MAX ? (int32_t)v : 0;
}

/* The receive waits for this message and announced its buffer: the payload written straight into it, the
 * GIL released (1: put the delivered frame); 0: put it as a plain frame (the receive, if it saw the claim,
 * waits for that one: core/fifo.h) */
int acpy_pair_deliver(PairLane *self, const call *c, ac_fifo *f) {
    ac_want w;
    int32_t pid = peer_pid(c->conn);
    if (pid == 0)
        return 0;
    int err = 0, got;
    Py_BEGIN_ALLOW_THREADS
    /* No receive waits yet: give it a moment to come (a ping-pong's peer is a few microseconds behind): up
     * to nbytes/32 ns (1 MiB: 32 us), a fraction of the copy through the FIFO it would save (~100 us). Not
     * for a native caller: it receives next (a sendrecv), and its peer may be doing the same */
    double until = acpy_work_monotonic() + (c->native ? 0.0 : (double)c->nbytes / 32e9);
    while (!(got = ac_fifo_claim(f, c->nbytes, c->tag, self->ctx, &w) != 0) && !ac_fifo_flag(f, AC_FIFO_WANT) &&
           acpy_work_monotonic() < until)
        sched_yield();
    if (got)
        err = ac_cma_write(pid, w.at, c->buf, c->nbytes);
    Py_END_ALLOW_THREADS
    if (!got)
        return 0;
    if (!err)
        self->delivered++;
    return !err;
}
