/* The CUDA driver calls, found at run time (cuda_driver.h). */
#include "cuda_driver.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

const ac_cuda_driver *ac_cuda;
static ac_cuda_driver table;

/* the versioned name first: the unversioned stream memory operations are the CUDA 11 forms */
static void *find(void *lib, const char *name, const char *versioned) {
    void *f = versioned ? dlsym(lib, versioned) : NULL;
    return f ? f : dlsym(lib, name);
}

int ac_cuda_load(const char *path, char *why, size_t why_len) {
    const char *lib_name = path ? path : "libcuda.so.1";
    void *lib = dlopen(lib_name, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        snprintf(why, why_len, "%s could not be loaded: %s", lib_name, dlerror());
        return -1;
    }
    struct {
        void **slot;
        const char *name, *versioned;
    } calls[] = {
        {(void **)&table.launch, "cuLaunchKernel", NULL},
        {(void **)&table.write32, "cuStreamWriteValue32", "cuStreamWriteValue32_v2"},
        {(void **)&table.wait32, "cuStreamWaitValue32", "cuStreamWaitValue32_v2"},
        {(void **)&table.event_record, "cuEventRecord", NULL},
        {(void **)&table.event_query, "cuEventQuery", NULL},
        {(void **)&table.event_sync, "cuEventSynchronize", NULL},
        {(void **)&table.stream_wait_event, "cuStreamWaitEvent", NULL},
        {(void **)&table.stream_is_capturing, "cuStreamIsCapturing", NULL},
        {(void **)&table.ctx_current, "cuCtxGetCurrent", NULL},
        {(void **)&table.error_name, "cuGetErrorName", NULL},
    };
    ac_cuda_driver got;
    memset(&got, 0, sizeof got);
    for (size_t k = 0; k < sizeof calls / sizeof calls[0]; k++) {
        void *f = find(lib, calls[k].name, calls[k].versioned);
        if (f == NULL) {
            snprintf(why, why_len, "%s has no %s", lib_name, calls[k].name);
            dlclose(lib);
            return -1;
        }
        *(void **)((char *)&got + ((char *)calls[k].slot - (char *)&table)) = f;
    }
    table = got; /* the old library stays loaded: a lane made before may still hold its functions */
    ac_cuda = &table;
    return 0;
}

const char *ac_cuda_error_name(cu_result rc, char *buf, size_t len) {
    const char *name = NULL;
    if (ac_cuda != NULL && ac_cuda->error_name(rc, &name) == CU_SUCCESS && name != NULL)
        return name;
    snprintf(buf, len, "CUresult %d", rc);
    return buf;
}
