/* The GPU lane (gpu_lane.c): a collective on GPU buffers, from the call to its launches, in C. */
#ifndef AIOCCL_GPU_LANE_H
#define AIOCCL_GPU_LANE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

extern PyTypeObject acpy_GpuLaneType, acpy_GpuPlanType;
int acpy_gpu_lane_ready(PyObject *module);
/* For a caller outside Python that holds the GIL (jax_ext's CUDA handlers, xla_ffi_gpu.c): the op of `entry`
 * (a learnt call: plan, name, desc, kind, timeout[, gives]) on `stream`, with its sequence number, event and
 * flight-recorder entry as run() gives them, and no Work. 1: launched; 0: not now, nothing launched (the lane
 * is off, a kernel failed, another context is current, the stream captures a graph); -1: an exception. */
int acpy_gpu_lane_launch(PyObject *lane, PyObject *entry, void *stream);
/* load_cuda([path]): the driver's calls from libcuda.so.1, or from `path` (a stand-in) */
PyObject *acpy_gpu_load_cuda(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#endif
