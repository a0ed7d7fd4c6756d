/* The point-to-point lane's object, shared by its three files: pair_lane.c (the type, send, recv from the
 * FIFO), pair_held.c (recv against what the engine's mailbox holds) and pair_native.c (the same verbs for a
 * caller outside Python, with the engine borrowed). Not exported beyond src/py/. */
#ifndef AIOCCL_PAIR_LANE_OBJECT_H
#define AIOCCL_PAIR_LANE_OBJECT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <numpy/arrayobject.h>

#include "core/bell.h"
#include "core/fifo.h"
#include "answers.h"
#include "work.h"

#define NOGIL_BYTES ((size_t)64 << 10) /* copies from this size on release the GIL */
enum { DTYPE_CACHE = 16, NAME_CACHE = 64 };

typedef struct {
    long long peer, tag;
    PyObject *name, *status; /* status: a receive's (None for sends) */
} named;

/* where a pair's FIFOs lie, for the connection `conn` (a reference kept: pair_fifos.c) */
typedef struct {
    PyObject *conn;
    ac_fifo tx, rx;
} pair_fifos;

typedef struct {
    PyObject_HEAD
    acpy_work_maker wm;
    PyObject *engine, *conns, *queued, *posted, *early, *wild, *probes, *lost;
    PyObject *pair_type, *group_var, *record, *status_type, *dtype_code, *ranks;
    PyObject *lock, *wake; /* a proxy thread's engine lock and its loop's wake-up (None inline: nothing to lend) */
    PyObject *wanted;      /* () -> whether anything besides this call waits for the engine's loop (turns.py) */
    PyObject *put_off;     /* the engine's sends put off, per world peer (engine/p2p/put_off.py) */
    struct { PyObject *descr; long code; } codes[DTYPE_CACHE];
    named names[2][NAME_CACHE]; /* send's and recv's Work names by (peer, tag): formatting one costs more than a send */
    ac_bell *bells;     /* per communicator rank */
    pair_fifos *fifos;  /* per communicator rank */
    int fd, rank, size, yield_cpu, enabled;
    unsigned long thread_id;
    unsigned long long ctx;
    Py_ssize_t eager;
    long long spin_ns, slice_ns, stall_ns, sent, received, spun, delivered, full;
} PairLane;

/* one call's arguments, checked (pair_lane.c's acpy_pair_check) */
typedef struct {
    PyArrayObject *arr; /* the caller's array; NULL: a native caller's buffer (pair_native.c) */
    uint8_t *buf;
    long long peer, tag;
    PyObject *world; /* borrowed from ranks */
    PyObject *conn;  /* borrowed from conns */
    long code;
    size_t nbytes;
    uint64_t want; /* a receive's want announced in the FIFO (its serial), or 0 */
    int owner;     /* the caller is the engine's own thread (its loop waits while the call runs) */
    int native;    /* a caller outside Python (pair_native.c): its receive announces no want, its send waits
                    * for none (XLA's buffers are often fresh pages, which cross-memory attach faults in slowly:
                    * a jitted 64 KiB sendrecv took 45 us written in place against 18 through the FIFO) */
    int why;       /* why the lane declined it, when it did (answers.h's acpy_no) */
} call;

/* The lane's verbs on a call whose buffer, peer, tag, code and size are filled in, by a caller that holds
 * the engine (its thread, or its lock borrowed) and the GIL (pair_lane.c):
 *   acpy_pair_check: 1 the lane may take it (world and conn filled in), 0 not (the general way), -1 an error;
 *   acpy_pair_put: 1 sent, 0 not (nothing written: the general way), 2 not (the FIFO stayed full, and the
 *   caller is the engine's thread, whose loop is wanted or whose receiver stalled: again from the loop), -1 an
 *   error;
 *   acpy_pair_get: 1 received from the FIFO, 3 received a message the mailbox held (the engine may have
 *   work: wake its loop), 0 not (the general way), 2 not come within the spin (the general way, without
 *   spinning again), -1 an error. */
int acpy_pair_check(PairLane *self, call *c);
/* The engine of a proxy thread, for a caller on another thread (pair_native.c): its lock taken without
 * waiting (1 taken, 0 busy or nothing to lend, -1 an error), and given back (`wake`: the engine's state
 * changed under it, a held message taken, so its loop looks; 0, or -1 an error) */
int acpy_pair_borrow(PairLane *self);
int acpy_pair_give_back(PairLane *self, int wake);
/* For a Python caller (pair_native.c): 1 on the engine's thread, 2 a proxy engine borrowed (give it back),
 * 0 neither (inline, or busy past the pair's spin: the general way), -1 an error */
int acpy_pair_on_engine(PairLane *self);

/* The single copy (pair_direct.c): from DIRECT_MIN bytes, a send whose receive waits and announced its
 * buffer writes the payload into it: 1 done (put the delivered frame), 0 not (put the plain frame) */
#define DIRECT_MIN ((size_t)64 << 10)
int acpy_pair_deliver(PairLane *self, const call *c, ac_fifo *f);
/* CLOCK_MONOTONIC in nanoseconds, for the lane's spins (pair_lane.c) */
int64_t acpy_pair_now_ns(void);
/* A send that finds the FIFO `f` full waits for room (pair_room.c; `back`: the FIFO from the same peer, or
 * NULL): 1 room, 0 none (the general way), -1 an error */
int acpy_pair_room(PairLane *self, ac_fifo *f, const ac_fifo *back, const call *c);
int acpy_pair_put(PairLane *self, call *c);
int acpy_pair_get(PairLane *self, call *c);

/* The FIFOs to and from the call's peer (either pointer may be NULL): 1, or 0 where they cannot be used
 * (pair_fifos.c; the caller checked the connection is open: acpy_pair_check) */
int acpy_pair_fifos(PairLane *self, const call *c, ac_fifo *tx, ac_fifo *rx);
int acpy_pair_fifos_ready(void);

/* What in the mailbox comes before this receive: 1 nothing, 2 a message held for it (*held, a new reference),
 * 0 something the general way must sort out, -1 an error (pair_held.c) */
int acpy_pair_ahead(PairLane *self, call *c, PyObject **held);
/* Take the held message `e` into the receive's buffer: 1 taken, 0 not for the lane, -1 an error */
int acpy_pair_take_held(PairLane *self, call *c, PyObject *e);
int acpy_pair_held_ready(void);

#endif
