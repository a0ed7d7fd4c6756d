/* The fast lane (fast_lane.c): a communicator's counters and its small all_reduce in C, and the same op
 * for a caller without Python (an XLA custom call, xla_ffi.c). */
#ifndef AIOCCL_FAST_LANE_H
#define AIOCCL_FAST_LANE_H

#include "channel_type.h"

extern PyTypeObject acpy_LaneType;
int acpy_fast_lane_ready(PyObject *module);

/* The lane's op without Python (an XLA custom call's): on the lane's channel when it is idle, with the
 * caller's buffers. AC_DONE: finished. ACPY_LANE_NOT_NOW: nothing taken, go the general way. Else an AC_*
 * code: the op took *seq and *order and must be carried on by the engine (it holds the channel no more;
 * AC_UNSUITABLE: nothing was published, the engine runs it from the start). */
enum { ACPY_LANE_NOT_NOW = -100 };

/* Set on this thread, with ACPY_LANE_NOT_NOW (or the pair lane's ACPY_PAIR_NOT_NOW), when what passed the op
 * to the general way is timing, not its form: the channel's gate or the engine was busy with earlier ops, a
 * receive spun and its message had not come, a FIFO stayed full. The XLA fallback counts such calls apart
 * (jax_ext.native_call.stats()'s "busy"): which road a call takes on a busy machine is timing, and a test
 * asserts that every other call took the lane. Read and cleared by the fallback. */
extern _Thread_local int acpy_lane_busy;

/* A lane of a communicator of one rank (no channel): takes *seq and returns 1 (every collective of one
 * rank is its input, in its output); 0: not such a lane, or disabled. */
int acpy_lane_alone(PyObject *lane, int64_t *seq);
int acpy_lane_run_native(PyObject *lane, const Program *prog, void *in, size_t in_len, void *out, size_t out_len,
                    int dtype, int redop, int64_t *seq, int64_t *order);

#endif
