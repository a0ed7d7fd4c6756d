/* A Work born done, made in C: the native lanes' (fastpath.c, gpu_lane.c) answer to an op they finished in
 * the call. It is the Python class aioccl.work.Work, its slots set in place as Work(name, seq) followed by
 * _start_done(result) would leave them, without running Python. */
#ifndef AIOCCL_WORK_H
#define AIOCCL_WORK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

enum { WORK_N_SLOTS = 20, WORK_SLOT_EVENT = 14 };

typedef struct {
    PyObject *type, *done_lock, *home, *engine_thread;
    Py_ssize_t off[WORK_N_SLOTS]; /* where each slot lives in a Work */
} WorkMaker;

/* Finds the slots of `type` (a TypeError if one is missing); 0 or -1. */
int work_maker_init(WorkMaker *m, PyObject *type, PyObject *done_lock, PyObject *home, unsigned long thread_id);
int work_maker_traverse(WorkMaker *m, visitproc visit, void *arg);
void work_maker_clear(WorkMaker *m);

/* A new done Work (NULL with an exception set). */
PyObject *work_born_done(const WorkMaker *m, PyObject *name, long long seq, PyObject *result, PyObject *desc,
                         double t0);
/* Into the flight recorder (`record`, its ring's append) with an op done in C: 0, or -1 with an error set. */
int work_record(PyObject *record, PyObject *name, long long seq, PyObject *desc, double t0);

/* Sets slot `slot` of Work `w` to `v` (a new reference, stolen). */
void work_set(const WorkMaker *m, PyObject *w, int slot, PyObject *v);

/* CLOCK_MONOTONIC in seconds: time.monotonic()'s clock. */
double work_monotonic(void);



/* 1: obj.name is value (a missing attribute: 0, no error) */
int work_attr_is(PyObject *obj, PyObject *name, PyObject *value);

/* 1: communicator `comm` takes an op now (not closed, no rank lost unless `lost_ok`, no group open in the
 * context variable `group_var`; comm NULL: the group only); 0: not now, the general way says why; -1: an
 * error is set. */
int work_comm_open(PyObject *comm, PyObject *group_var, int lost_ok);
#endif
