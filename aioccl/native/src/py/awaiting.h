/* Awaiting a Work that is already done, in C: the hot path of `await comm.all_reduce(x)` (awaiting.c). */
#ifndef AIOCCL_AWAITING_H
#define AIOCCL_AWAITING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Adds Awaiting (the Work's base class), awaiting_setup, loop_turned and last_turn to module m: 0 or -1. */
int acpy_awaiting_ready(PyObject *m);

#endif
