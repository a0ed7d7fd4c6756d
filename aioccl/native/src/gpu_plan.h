/* GpuPlan (gpu_plan.c): one GPU op's kernel launches, arguments packed once; the GPU lane runs them. */
#ifndef AIOCCL_GPU_PLAN_H
#define AIOCCL_GPU_PLAN_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "cuda_driver.h"

enum { MAX_ARGS = 32 };

typedef struct {
    cu_handle fn;
    unsigned grid, threads;
    int nargs, epoch_at;
    unsigned long long slots[MAX_ARGS]; /* one argument per 8-byte slot: a 4-byte one is its first half */
    void *params[MAX_ARGS];             /* what cuLaunchKernel reads: the slots' addresses */
} launch;

typedef struct {
    PyObject_HEAD
    int npieces, stream_form;
    launch *l; /* per piece: the launch (spin), or publish then consume (stream) */
} GpuPlan;

extern PyTypeObject GpuPlanType;

#endif
