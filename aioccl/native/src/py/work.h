/* A Work born done, made in C: the native lanes' (fast_lane.c, gpu_lane.c) answer to an op they finished in
 * the call. It is the Python class aioccl.work.Work, its slots set in place as Work(name, seq) followed by
 * _start_done(result) would leave them, without running Python. */
#ifndef AIOCCL_WORK_H
#define AIOCCL_WORK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

enum { ACPY_WORK_N_SLOTS = 20, ACPY_WORK_SLOT_EVENT = 14 };

typedef struct {
    PyObject *type, *done_lock, *home, *engine_thread;
    PyObject *spare; /* the last Work made: made again in place once nothing else holds it (work.c) */
    int recycle;     /* whether to keep a spare (the host lanes: the spare holds its op's result, a host array,
                      * until the next op; not the GPU lane, whose results are device memory) */
    Py_ssize_t off[ACPY_WORK_N_SLOTS]; /* where each slot lives in a Work */
} acpy_work_maker;

/* Finds the slots of `type` (a TypeError if one is missing); 0 or -1. */
int acpy_work_maker_init(acpy_work_maker *m, PyObject *type, PyObject *done_lock, PyObject *home, unsigned long thread_id);
int acpy_work_maker_traverse(acpy_work_maker *m, visitproc visit, void *arg);
void acpy_work_maker_clear(acpy_work_maker *m);

/* A done Work that nothing else holds (NULL with an exception set). */
PyObject *acpy_work_born_done(acpy_work_maker *m, PyObject *name, long long seq, PyObject *result, PyObject *desc,
                         double t0);
/* Into the flight recorder (`record`, its ring's append) with an op done in C: 0, or -1 with an error set. */
int acpy_work_record(PyObject *record, PyObject *name, long long seq, PyObject *desc, double t0);

/* Sets slot `slot` of Work `w` to `v` (a new reference, stolen). */
void acpy_work_set(const acpy_work_maker *m, PyObject *w, int slot, PyObject *v);

/* CLOCK_MONOTONIC in seconds: time.monotonic()'s clock. */
double acpy_work_monotonic(void);



/* 1: no group is open in the context variable `group_var` (the call runs now, not at the group's exit); 0: one
 * is, the general way queues the op; -1: an error is set. A closed, aborted or shrunk communicator, or one
 * that lost a rank, is not asked here: its owner switches its lanes off (aioccl/state.py's CommState, lanes_off) when that
 * happens. */
int acpy_work_no_group(PyObject *group_var);
#endif
