/* A synthetic XLA call frame for driving jax_ext's FFI handlers without XLA (tests/test_xla_ffi_gpu.py).
 *
 * ffi_frame_call(handler, ...) builds what XLA hands a typed FFI handler at its execute stage: an API whose
 * XLA_FFI_Stream_Get answers the given stream and whose XLA_FFI_Error_Create keeps the message, one
 * argument buffer per input (float32, one dimension) plus the mesh position (an int32 scalar) and a token,
 * one result buffer per output plus a token, and a "site" attribute of the given dtype. It calls the
 * handler and returns 0, or -1 with the handler's error message copied into msg. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "xla/ffi/api/c_api.h"

struct XLA_FFI_Error {
    XLA_FFI_Error_Code code;
};

static struct XLA_FFI_Error the_error;
static char the_message[4096];
static void *the_stream;
static int stream_asks;

static XLA_FFI_Error *error_create(XLA_FFI_Error_Create_Args *a) {
    snprintf(the_message, sizeof the_message, "%s", a->message ? a->message : "");
    the_error.code = a->errc;
    return &the_error;
}

static XLA_FFI_Error *stream_get(XLA_FFI_Stream_Get_Args *a) {
    stream_asks++;
    a->stream = the_stream;
    return NULL;
}

int ffi_frame_stream_asks(void) { return stream_asks; }

enum { MAX_BUFS = 6 };

int ffi_frame_call(XLA_FFI_Handler *handler, long long site, int site_dtype, void *stream, int nin,
                   void *const *ins, const int64_t *in_elems, int nout, void *const *outs, const int64_t *out_elems,
                   int32_t *position, char *msg, size_t len) {
    if (nin > MAX_BUFS - 2 || nout > MAX_BUFS - 1)
        return -2;
    XLA_FFI_Api api;
    memset(&api, 0, sizeof api);
    api.struct_size = sizeof api;
    api.XLA_FFI_Error_Create = error_create;
    api.XLA_FFI_Stream_Get = stream_get;
    the_stream = stream;
    int ctx_token = 0;
    XLA_FFI_Buffer args[MAX_BUFS], rets[MAX_BUFS];
    int64_t dims[2 * MAX_BUFS];
    void *arg_ptrs[MAX_BUFS], *ret_ptrs[MAX_BUFS];
    XLA_FFI_ArgType arg_types[MAX_BUFS];
    XLA_FFI_RetType ret_types[MAX_BUFS];
    memset(args, 0, sizeof args);
    memset(rets, 0, sizeof rets);
    int na = 0, nr = 0;
    args[na] = (XLA_FFI_Buffer){.struct_size = sizeof(XLA_FFI_Buffer), .dtype = XLA_FFI_DataType_TOKEN};
    na++;
    for (int k = 0; k < nin; k++, na++) {
        dims[k] = in_elems[k];
        args[na] = (XLA_FFI_Buffer){.struct_size = sizeof(XLA_FFI_Buffer), .dtype = XLA_FFI_DataType_F32,
                                    .data = ins[k], .rank = 1, .dims = &dims[k]};
    }
    args[na++] = (XLA_FFI_Buffer){.struct_size = sizeof(XLA_FFI_Buffer), .dtype = XLA_FFI_DataType_S32,
                                  .data = position, .rank = 0, .dims = NULL};
    rets[nr++] = (XLA_FFI_Buffer){.struct_size = sizeof(XLA_FFI_Buffer), .dtype = XLA_FFI_DataType_TOKEN};
    for (int k = 0; k < nout; k++, nr++) {
        dims[MAX_BUFS + k] = out_elems[k];
        rets[nr] = (XLA_FFI_Buffer){.struct_size = sizeof(XLA_FFI_Buffer), .dtype = XLA_FFI_DataType_F32,
                                    .data = outs[k], .rank = 1, .dims = &dims[MAX_BUFS + k]};
    }
    for (int k = 0; k < na; k++) {
        arg_ptrs[k] = &args[k];
        arg_types[k] = XLA_FFI_ArgType_BUFFER;
    }
    for (int k = 0; k < nr; k++) {
        ret_ptrs[k] = &rets[k];
        ret_types[k] = XLA_FFI_RetType_BUFFER;
    }
    XLA_FFI_ByteSpan name = {"site", 4};
    XLA_FFI_ByteSpan *names[1] = {&name};
    XLA_FFI_Scalar scalar = {(XLA_FFI_DataType)site_dtype, &site};
    void *attrs[1] = {&scalar};
    XLA_FFI_AttrType attr_types[1] = {XLA_FFI_AttrType_SCALAR};
    XLA_FFI_CallFrame cf;
    memset(&cf, 0, sizeof cf);
    cf.struct_size = sizeof cf;
    cf.api = &api;
    cf.ctx = (XLA_FFI_ExecutionContext *)(void *)&ctx_token;
    cf.stage = XLA_FFI_ExecutionStage_EXECUTE;
    cf.args = (XLA_FFI_Args){sizeof(XLA_FFI_Args), NULL, na, arg_types, arg_ptrs};
    cf.rets = (XLA_FFI_Rets){sizeof(XLA_FFI_Rets), NULL, nr, ret_types, ret_ptrs};
    cf.attrs = (XLA_FFI_Attrs){sizeof(XLA_FFI_Attrs), NULL, 1, attr_types, names, attrs};
    XLA_FFI_Error *err = handler(&cf);
    if (err == NULL)
        return 0;
    snprintf(msg, len, "%s", the_message);
    return -1;
}
