/* The fast lane (fastpath.c) needs the Channel type of module.c. */
#ifndef AIOCCL_FASTPATH_H
#define AIOCCL_FASTPATH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "channel.h"
#include "gate.h"

typedef struct {
    PyObject_HEAD
    ac_chan ch;
    Py_buffer *views;
    int nviews;
    PyObject *held[3]; /* the program and buffers of the op in progress */
    PyObject *pending; /* the caller's record of an op run() left unfinished, until it claims it */
    int last;          /* what the last run() returned */
    ac_gate gate;      /* who runs the next op: the engine or a native caller (gate.h) */
    int bell_fd;       /* a datagram socket to ring the channel ranks' doorbells from C, or -1 */
    struct ac_bell *bells;
} Channel;

typedef struct {
    PyObject_HEAD
    int64_t *words;
    size_t len;
    int rank, size;
} Program;

extern PyTypeObject ChannelType, ProgramType, LaneType;
int fastpath_ready(PyObject *module);

/* Ring the doorbells of the channel ranks in `mask` (without the GIL; a no-op before bells are set). */
void channel_ring(Channel *chan, uint64_t mask);

/* The lane's op without Python (an XLA custom call's): on the lane's channel when it is idle, with the
 * caller's buffers. AC_DONE: finished. LANE_NOT_NOW: nothing taken, go the general way. Else an AC_*
 * code: the op took *seq and *order and must be carried on by the engine (it holds the channel no more;
 * AC_UNSUITABLE: nothing was published, the engine runs it from the start). */
enum { LANE_NOT_NOW = -100 };

/* A lane of a communicator of one rank (no channel): takes *seq and returns 1 (every collective of one
 * rank is its input, in its output); 0: not such a lane, or disabled. */
int lane_alone(PyObject *lane, int64_t *seq);
int lane_run_native(PyObject *lane, const Program *prog, void *in, size_t in_len, void *out, size_t out_len,
                    int dtype, int redop, int64_t *seq, int64_t *order);

#endif
