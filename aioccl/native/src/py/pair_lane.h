/* The point-to-point lane (pair_lane.c): isend and irecv of a numpy array to or from a same-host peer over
 * its shared-memory pair, from the call to the done Work in C. */
#ifndef AIOCCL_PAIR_LANE_H
#define AIOCCL_PAIR_LANE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

extern PyTypeObject acpy_PairLaneType;
int acpy_pair_lane_ready(PyObject *module);

/* One point-to-point op of a caller outside Python (pair_native.c): send `send` to rank `dest` and/or
 * receive `recv` from rank `source` (-1: no such half), both with `tag`; codes: the frames' dtype codes. */
typedef struct {
    void *send, *recv;
    size_t send_len, recv_len;
    int dest, source, send_code, recv_code;
    long long tag;
} acpy_pair_op;

/* What became of it: done; nothing done (the general way runs it all); the send done, the receive not */
enum { ACPY_PAIR_DONE = 0, ACPY_PAIR_NOT_NOW = -100, ACPY_PAIR_SENT = -101 };

/* Run `op` on `lane` (a PairLane) from any thread, without the GIL (it is taken inside) */
int acpy_pair_native(PyObject *lane, const acpy_pair_op *op);
int acpy_pair_native_ready(void);

#endif
