/* What jax_ext's CPU (xla_ffi.c) and CUDA (xla_ffi_gpu.c) custom calls share: the sites, reading a call
 * frame, and turning errors into XLA's. Internal to the CPython layer. */
#ifndef AIOCCL_XLA_SITE_H
#define AIOCCL_XLA_SITE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "xla/ffi/api/c_api.h"

#include "pair_lane.h"

enum { ACPY_FFI_VARIANTS = 2, ACPY_FFI_MAX_OPERANDS = 8, ACPY_FFI_KINDS = 16 };

typedef struct {
    PyObject *prog; /* the Program this member ran for this variant (owned) */
    int dtype, redop;
    int in_is, out_is; /* which of XLA's buffers the program's IN and OUT are */
    int ready;         /* set last (release): the handler reads the rest after seeing it (acquire) */
} acpy_ffi_recipe;

typedef struct {
    PyObject *lane; /* the member communicator's Lane (owned), or NULL: always the fallback */
    acpy_ffi_recipe r[ACPY_FFI_VARIANTS]; /* [0]: output apart from the input, [1]: the same buffer */
    PyObject *pair;     /* point-to-point: the member communicator's PairLane (owned), or NULL */
    acpy_pair_op op;    /* and its peers, tag and dtype codes (the buffers are each call's) */
    int pair_ready;     /* set last (release), as recipe.ready */
    /* on a GPU, read and written with the GIL held: the member communicator's GpuLane (owned) and what it
     * learnt, {(in address, out address, in bytes, out bytes, stream): (plan, name, desc, kind, timeout)} */
    PyObject *gpu_lane, *gpu_plans;
} acpy_ffi_member;

typedef struct {
    int kind, nmembers;
    acpy_ffi_member *members;
    PyObject *fallback;     /* CPU: fallback(pos, variant, rc, seq, order, ins, outs) */
    PyObject *gpu_fallback; /* CUDA: gpu_fallback(stream, pos address, ins, outs): (address, bytes) each; or NULL */
} acpy_ffi_site;

typedef struct { /* a call frame, read and checked */
    acpy_ffi_site *site;
    XLA_FFI_Buffer *ins[ACPY_FFI_MAX_OPERANDS], *outs[ACPY_FFI_MAX_OPERANDS];
    int nin, nout;          /* without tokens; ins without the mesh position */
    XLA_FFI_Buffer *where;  /* the mesh position (an int32 scalar: host memory on CPU, device memory on GPU) */
} acpy_ffi_call;

extern uint64_t acpy_ffi_calls_native, acpy_ffi_calls_python;

XLA_FFI_Error *acpy_ffi_fail(const XLA_FFI_CallFrame *cf, XLA_FFI_Error_Code code, const char *msg);
/* The frame read into c: NULL, or the error. At the metadata stage, XLA's answer (NULL) and c->site NULL. */
XLA_FFI_Error *acpy_ffi_read(XLA_FFI_CallFrame *cf, int kind, acpy_ffi_call *c);

/* One entry point per kind, each calling handle(cf, kind), and their table `table` */
#define ACPY_FFI_ENTRY(p, k) \
    static XLA_FFI_Error *p##k(XLA_FFI_CallFrame *cf) { return handle(cf, k); }
#define ACPY_FFI_HANDLERS(p, table) \
    ACPY_FFI_ENTRY(p, 0) ACPY_FFI_ENTRY(p, 1) ACPY_FFI_ENTRY(p, 2) ACPY_FFI_ENTRY(p, 3) ACPY_FFI_ENTRY(p, 4) \
    ACPY_FFI_ENTRY(p, 5) ACPY_FFI_ENTRY(p, 6) ACPY_FFI_ENTRY(p, 7) ACPY_FFI_ENTRY(p, 8) ACPY_FFI_ENTRY(p, 9) \
    ACPY_FFI_ENTRY(p, 10) ACPY_FFI_ENTRY(p, 11) ACPY_FFI_ENTRY(p, 12) ACPY_FFI_ENTRY(p, 13) ACPY_FFI_ENTRY(p, 14) \
    ACPY_FFI_ENTRY(p, 15) \
    static XLA_FFI_Handler *const table[ACPY_FFI_KINDS] = {p##0, p##1, p##2, p##3, p##4, p##5, p##6, p##7, p##8, \
                                                          p##9, p##10, p##11, p##12, p##13, p##14, p##15};
size_t acpy_ffi_bytes(const XLA_FFI_Buffer *b);
/* the raised exception as an XLA error text into msg; whether it is the fallback's own (tagged) report */
int acpy_ffi_error_text(PyObject *exc, char *msg, size_t size);
PyObject *acpy_ffi_take_exception(void);
/* with the GIL: the site at index `index`, or NULL with an exception */
acpy_ffi_site *acpy_ffi_site_at(PyObject *index);
/* the CUDA handlers (xla_ffi_gpu.c): ffi_gpu_handlers and ffi_gpu_learn added to the module */
int acpy_xla_ffi_gpu_ready(PyObject *module);
extern PyObject *acpy_ffi_kind_names[ACPY_FFI_KINDS];

#endif
