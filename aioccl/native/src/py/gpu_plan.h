/* GpuPlan (gpu_plan.c): one GPU op's kernel launches, arguments packed once; the GPU lane runs them. */
#ifndef AIOCCL_GPU_PLAN_H
#define AIOCCL_GPU_PLAN_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "core/launch.h"

typedef struct {
    PyObject_HEAD
    ac_plan p; /* the launches (core/launch.h), parsed and checked once */
} GpuPlan;

extern PyTypeObject acpy_GpuPlanType;

#endif
