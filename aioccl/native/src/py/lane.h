/* The CPU lane's object, shared by its two files: fast_lane.c (the type, the counters, the in-place
 * all_reduce and the XLA handlers' entry) and lane_calls.c (every other collective call seen before). Not
 * exported beyond src/py/. */
#ifndef AIOCCL_LANE_H
#define AIOCCL_LANE_H

#include "channel_type.h"
#include "core/reduce.h"
#include "work.h"

enum { CACHE = 64, ACPY_CODE_ALL_REDUCE = 1 /* algorithms/table.py's code */ };
#define NATIVE_WAIT_S 0.02 /* how long a native caller outside the engine waits in C for a late peer */

typedef struct {
    int64_t count;
    int dtype;
    PyObject *prog;
} cached;

typedef struct acpy_calls acpy_calls; /* lane_calls.c: the calls learnt so far */

/* Nonzero while jax_ext learns on this thread what an op runs (fast_lane.CAPTURE.learning()): the general
 * way must build the op to be seen, so the lane declines (a C thread-local: looking up the Python one
 * cost a tenth of a small op) */
extern _Thread_local int acpy_lane_learning;

typedef struct {
    PyObject_HEAD
    Channel *chan;
    PyObject *lock, *group_var, *record, *ring_bells;
    PyObject *ops[AC_OP_LAST + 1];
    PyObject *name;
    PyObject *pending; /* the Handover last given to the engine (answers.h), until claimed */
    acpy_work_maker wm; /* its Works */
    unsigned long thread_id;
    int bf16_num, enabled;
    Py_ssize_t max_bytes;
    long long seq;     /* atomic: an XLA thread takes numbers without the GIL (the order: chan->gate) */
    cached cache[CACHE];
    acpy_calls *calls;
    long long ran; /* calls run() finished in C (for tests and aioccl-info) */
} Lane;

/* The AC_DT_* code of a numpy dtype descriptor (0: not one the core reduces), and the AC_OP_* code of a
 * reduction given as a ReduceOp member or its name (0: neither; NULL: sum). */
int acpy_lane_dtype(Lane *self, PyObject *descr);
int acpy_lane_redop(Lane *self, PyObject *op);

/* Run `prog` over in/out on the lane's channel from the caller's thread (borrowing an idle engine's lock
 * when it is not the engine's thread), the GIL released for the protocol. Returns 1: done (*seq, *t0 set);
 * 0: not now (nothing taken, the general way); 2: taken and unfinished (*rc, *seq, *order set: the engine
 * carries it on; `hold` keeps the buffers alive meanwhile); -1: an error is set. */
int acpy_lane_go(Lane *self, PyObject *prog, void *in, size_t in_len, void *out, size_t out_len, int dtype,
                 int redop, PyObject *hold_in, PyObject *hold_out, long long *seq, int64_t *order, int *rc,
                 double *t0);

/* lane_calls.c: the table of calls learnt, and the Lane's methods over it */
acpy_calls *acpy_calls_new(void);
void acpy_calls_clear(acpy_calls *c);
void acpy_calls_free(acpy_calls *c);
int acpy_calls_traverse(acpy_calls *c, visitproc visit, void *arg);
PyObject *acpy_lane_run(Lane *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *acpy_lane_teach(Lane *self, PyObject *const *args, Py_ssize_t nargs);

#endif
