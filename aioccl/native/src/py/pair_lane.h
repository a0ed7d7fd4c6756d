/* The point-to-point lane (pair_lane.c): isend and irecv of a numpy array to or from a same-host peer over
 * its shared-memory pair, from the call to the done Work in C. */
#ifndef AIOCCL_PAIR_LANE_H
#define AIOCCL_PAIR_LANE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

extern PyTypeObject acpy_PairLaneType;
int acpy_pair_lane_ready(PyObject *module);

#endif
