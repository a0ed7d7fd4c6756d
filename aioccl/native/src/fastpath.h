/* The fast lane (fastpath.c) needs the Channel type of module.c. */
#ifndef AIOCCL_FASTPATH_H
#define AIOCCL_FASTPATH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "channel.h"

typedef struct {
    PyObject_HEAD
    ac_chan ch;
    Py_buffer *views;
    int nviews;
    PyObject *held[3]; /* the program and buffers of the op in progress */
    PyObject *pending; /* the caller's record of an op run() left unfinished, until it claims it */
    int last;          /* what the last run() returned */
} Channel;

typedef struct {
    PyObject_HEAD
    int64_t *words;
    size_t len;
    int rank, size;
} Program;

extern PyTypeObject ChannelType, ProgramType, LaneType;
int fastpath_ready(PyObject *module);

#endif
