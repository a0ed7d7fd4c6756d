/* Program and Channel (channel_type.c): the Python types over the channel protocol (core/channel.h), the
 * gate's engine side (core/gate.h) and the doorbells rung from C (core/bell.h). */
#ifndef AIOCCL_CHANNEL_TYPE_H
#define AIOCCL_CHANNEL_TYPE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "core/bell.h"
#include "core/channel.h"
#include "core/gate.h"

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
    ac_bell *bells;    /* each channel rank's doorbell address (bell.h) */
} Channel;

typedef struct {
    PyObject_HEAD
    int64_t *words;
    size_t len;
    int rank, size;
} Program;

extern PyTypeObject acpy_ChannelType, acpy_ProgramType;
int acpy_channel_type_ready(PyObject *module);

/* Ring the doorbells of the channel ranks in `mask` (without the GIL; a no-op before bells are set). */
void acpy_channel_ring_bells(Channel *chan, uint64_t mask);

#endif
