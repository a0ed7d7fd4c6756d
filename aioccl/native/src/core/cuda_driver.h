/* The few CUDA driver calls the GPU lane makes (gpu_lane.c), found at run time in libcuda.so.1 (or a
 * stand-in library that records them, for the tests), so the core builds without CUDA's headers and
 * loads on machines without a GPU. The types are the driver's, spelled without its header. */
#ifndef AIOCCL_CUDA_DRIVER_H
#define AIOCCL_CUDA_DRIVER_H

#include <stddef.h>

typedef int cu_result;
typedef void *cu_handle; /* CUcontext, CUstream, CUfunction, CUevent */
enum { CU_SUCCESS = 0, CU_NOT_READY = 600, CU_WAIT_GEQ = 0 };

typedef struct {
    cu_result (*launch)(cu_handle f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shmem, cu_handle stream, void **params, void **extra);
    cu_result (*write32)(cu_handle stream, unsigned long long addr, unsigned value, unsigned flags);
    cu_result (*wait32)(cu_handle stream, unsigned long long addr, unsigned value, unsigned flags);
    cu_result (*event_record)(cu_handle ev, cu_handle stream);
    cu_result (*event_query)(cu_handle ev);
    cu_result (*event_sync)(cu_handle ev);
    cu_result (*stream_wait_event)(cu_handle stream, cu_handle ev, unsigned flags);
    cu_result (*stream_is_capturing)(cu_handle stream, int *status);
    cu_result (*ctx_current)(cu_handle *ctx);
    cu_result (*error_name)(cu_result rc, const char **name);
} ac_cuda_driver;

/* The driver, once loaded (NULL before). */
extern const ac_cuda_driver *ac_cuda;

/* Loads `path` (NULL: libcuda.so.1) and resolves every call; 0, or -1 with the reason in `why`. A later call
 * replaces the table (the tests load a stand-in). */
int ac_cuda_load(const char *path, char *why, size_t why_len);

/* "CUDA_ERROR_..." for rc, or "CUresult <rc>" where the driver has no name for it. */
const char *ac_cuda_error_name(cu_result rc, char *buf, size_t len);

#endif
