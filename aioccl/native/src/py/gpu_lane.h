/* The GPU lane (gpu_lane.c): a collective on GPU buffers, from the call to its launches, in C. */
#ifndef AIOCCL_GPU_LANE_H
#define AIOCCL_GPU_LANE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

extern PyTypeObject acpy_GpuLaneType, acpy_GpuPlanType;
int acpy_gpu_lane_ready(PyObject *module);
/* load_cuda([path]): the driver's calls from libcuda.so.1, or from `path` (a stand-in) */
PyObject *acpy_gpu_load_cuda(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#endif
