/* A stand-in for libcuda.so.1 with the calls the GPU lane makes: each call is recorded (what it was given,
 * the kernel's first arguments read through its parameter array), events complete when the test says so,
 * and a call can be told to fail. tests/test_gpu_lane.py builds it and loads it with load_cuda(path). */
#include <string.h>

enum { LOG = 8192, ARGS = 24, NOT_READY = 600 };

typedef struct {
    int call; /* 1 launch, 2 write32, 3 wait32, 4 event record, 5 stream wait event, 6 event sync */
    void *handle, *stream;
    unsigned long long addr;
    unsigned value, grid, threads;
    unsigned long long args[ARGS];
} record;

static record log_[LOG];
static int n_log, fail_call, fail_rc, capturing, nargs = ARGS;
static void *context = (void *)0x5eed;
static unsigned long long recorded[4096]; /* event handle (small integers) -> how many records so far */
static unsigned long long completed[4096]; /* ... and how many of them completed */

static record *next(int call) {
    record *r = &log_[n_log < LOG ? n_log++ : LOG - 1];
    memset(r, 0, sizeof *r);
    r->call = call;
    return r;
}

static int failing(int call) {
    if (fail_call != call)
        return 0;
    fail_call = 0;
    return fail_rc;
}

int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shmem, void *stream, void **params, void **extra) {
    (void)gy, (void)gz, (void)by, (void)bz, (void)shmem, (void)extra;
    int rc = failing(1);
    if (rc)
        return rc;
    record *r = next(1);
    r->handle = f, r->stream = stream, r->grid = gx, r->threads = bx;
    for (int k = 0; k < nargs; k++)
        r->args[k] = *(unsigned long long *)params[k];
    return 0;
}

int cuStreamWriteValue32_v2(void *stream, unsigned long long addr, unsigned value, unsigned flags) {
    (void)flags;
    int rc = failing(2);
    if (rc)
        return rc;
    record *r = next(2);
    r->stream = stream, r->addr = addr, r->value = value;
    return 0;
}

int cuStreamWaitValue32_v2(void *stream, unsigned long long addr, unsigned value, unsigned flags) {
    record *r = next(3);
    r->stream = stream, r->addr = addr, r->value = value, r->grid = flags;
    return 0;
}

int cuEventRecord(void *ev, void *stream) {
    record *r = next(4);
    r->handle = ev, r->stream = stream;
    recorded[(unsigned long long)ev % 4096]++;
    return 0;
}

int cuEventQuery(void *ev) {
    unsigned long long k = (unsigned long long)ev % 4096;
    return completed[k] >= recorded[k] ? 0 : NOT_READY;
}

int cuEventSynchronize(void *ev) {
    unsigned long long k = (unsigned long long)ev % 4096;
    next(6)->handle = ev;
    completed[k] = recorded[k];
    return 0;
}

int cuStreamWaitEvent(void *stream, void *ev, unsigned flags) {
    (void)flags;
    record *r = next(5);
    r->stream = stream, r->handle = ev;
    return 0;
}

int cuStreamIsCapturing(void *stream, int *status) {
    (void)stream;
    *status = capturing;
    return 0;
}

int cuCtxGetCurrent(void **ctx) {
    *ctx = context;
    return 0;
}

int cuGetErrorName(int rc, const char **name) {
    *name = rc == 700 ? "CUDA_ERROR_ILLEGAL_ADDRESS" : NULL;
    return *name ? 0 : 1;
}

/* -- the test's side -- */
int standin_count(void) { return n_log; }
const record *standin_log(void) { return log_; }
void standin_reset(void) { n_log = 0; }
void standin_fail(int call, int rc) { fail_call = call, fail_rc = rc; }
void standin_capturing(int on) { capturing = on; }
void standin_context(void *ctx) { context = ctx; }
void standin_nargs(int n) { nargs = n; }
void standin_complete_all(void) { memcpy(completed, recorded, sizeof completed); }
