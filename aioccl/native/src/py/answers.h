/* A lane's typed answers (answers.c): why a native lane declined a call, and the op it started and hands to the
 * engine. */
#ifndef ACPY_ANSWERS_H
#define ACPY_ANSWERS_H
#include <Python.h>

/* why a lane declined (answers.c's REASONS names them; aioccl/native/answers.py explains each) */
typedef enum {
    ACPY_NO_OFF,      /* switched off: the communicator is closed, aborted, shrunk or lost a rank */
    ACPY_NO_BUFFERS,  /* buffers of a kind, dtype, reduction or layout the lane does not take */
    ACPY_NO_SIZE,     /* empty, or larger than the lane's limit */
    ACPY_NO_FORM,     /* a form the lane has not learnt yet */
    ACPY_NO_BUSY,     /* not now: the channel or engine has other ops, or another thread holds the engine */
    ACPY_NO_GROUP,    /* inside comm.group() */
    ACPY_NO_LEARNING, /* jax_ext learns on this thread what an op runs */
    ACPY_NO_SPUN,     /* a receive that spun and saw nothing come: the engine posts it, without spinning again */
    ACPY_NO_FULL,     /* a send whose FIFO stayed full while its loop was wanted: put off, sent from the loop */
    ACPY_NO_DEVICE,   /* another device or stream than the learnt call's, or a graph being captured */
    ACPY_NO_WILDCARD, /* ANY_SOURCE or ANY_TAG: only the engine matches wildcards */
    ACPY_NO_REASONS
} acpy_no;

PyObject *acpy_declined(acpy_no why); /* a new reference to the one Declined of that reason */
/* Handover(template, inp, out, op, rc, seq, order, given): a new reference, NULL on error */
PyObject *acpy_handover(PyObject *template_, PyObject *inp, PyObject *out, PyObject *op, int rc, long long seq,
                        long long order, PyObject *given);
int acpy_answers_ready(PyObject *m);
#endif
