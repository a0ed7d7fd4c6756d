/* A CUDA driver for tests/fakecupy: the calls the GPU lane makes (aioccl/native/src/core/cuda_driver.c), each
 * handed to a function the stand-in cupy registered (tests/fakecupy/cupy/cuda/_bridge.py), which runs it
 * on the stand-in's late streams. So the lane runs end to end, its ops exact, on machines without a GPU.
 * The lane calls these without the GIL; ctypes' callbacks take it. */
#include <stddef.h>

typedef int (*launch_fn)(void *f, unsigned grid, unsigned threads, void *stream, void **params);
typedef int (*value_fn)(void *stream, unsigned long long addr, unsigned value, unsigned flags);
typedef int (*pair_fn)(void *a, void *b);
typedef int (*one_fn)(void *h);

static launch_fn on_launch;
static value_fn on_write, on_wait;
static pair_fn on_record, on_stream_wait;
static one_fn on_query, on_sync;
enum { UNREGISTERED = 999 };

void bridge_register(launch_fn launch, value_fn write, value_fn wait, pair_fn record, one_fn query, one_fn sync,
                     pair_fn stream_wait) {
    on_launch = launch, on_write = write, on_wait = wait, on_record = record, on_query = query, on_sync = sync;
    on_stream_wait = stream_wait;
}

int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shmem, void *stream, void **params, void **extra) {
    (void)gy, (void)gz, (void)by, (void)bz, (void)shmem, (void)extra;
    return on_launch ? on_launch(f, gx, bx, stream, params) : UNREGISTERED;
}

int cuStreamWriteValue32_v2(void *stream, unsigned long long addr, unsigned value, unsigned flags) {
    return on_write ? on_write(stream, addr, value, flags) : UNREGISTERED;
}

int cuStreamWaitValue32_v2(void *stream, unsigned long long addr, unsigned value, unsigned flags) {
    return on_wait ? on_wait(stream, addr, value, flags) : UNREGISTERED;
}

int cuEventRecord(void *ev, void *stream) { return on_record ? on_record(ev, stream) : UNREGISTERED; }
int cuEventQuery(void *ev) { return on_query ? on_query(ev) : UNREGISTERED; }
int cuEventSynchronize(void *ev) { return on_sync ? on_sync(ev) : UNREGISTERED; }
int cuStreamWaitEvent(void *stream, void *ev, unsigned flags) {
    (void)flags;
    return on_stream_wait ? on_stream_wait(stream, ev) : UNREGISTERED;
}

int cuStreamIsCapturing(void *stream, int *status) {
    (void)stream;
    *status = 0; /* the stand-in cannot capture */
    return 0;
}

int cuCtxGetCurrent(void **ctx) {
    *ctx = (void *)0xC0; /* what the stand-in's cupy.cuda.driver.ctxGetCurrent answers */
    return 0;
}

int cuGetErrorName(int rc, const char **name) {
    *name = rc == UNREGISTERED ? "the bridge has no stand-in registered" : NULL;
    return *name ? 0 : 1;
}
