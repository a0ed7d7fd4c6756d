/* XLA custom calls for jax_ext's collectives: typed FFI handlers (api_version 1) over XLA's buffers.
 *
 * One handler per op (aioccl_all_reduce, ...), registered by jax_ext for the CPU. Each call names its
 * *site* (an attribute): the op as lowered, its communicators by mesh position (the last operand), and
 * what each has learnt. A site member whose op the native core can run (a same-host channel, a small
 * op of lockstep steps) runs it here, on XLA's thread, with no Python and no GIL: the lane's counters,
 * the channel's gate (gate.h), the protocol (channel.c). Everything else goes to the site's Python
 * fallback, with the GIL taken then only:
 *   - the first call of each shape, which runs the op the engine's way and teaches the site the program
 *     it ran, so that the next calls are native (jax_ext/native_call.py);
 *   - ops the core cannot run (large, other hosts) and calls that find the channel busy;
 *   - a native op that must wait longer than a spin, or failed: the engine carries it on from where the
 *     core left it (deadlines, verdicts, lost peers, errors are the engine's, as for any op).
 * Point-to-point ops (send, recv, sendrecv, ppermute) run on the member communicator's PairLane after the
 * first call taught the site its peers (pair_native.c): both halves in C, or the send in C and the receive
 * the fallback's (ACPY_PAIR_SENT), or nothing (the fallback runs it all).
 * A Python exception becomes the call's error (its text; jax_ext keeps the exception itself).
 *
 * Everything read from the call frame is checked: the attribute's type and range, each operand's
 * type, the mesh position against the site's members, the buffer sizes against the learnt program. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "xla/ffi/api/c_api.h"

#include "core/channel.h"
#include "fast_lane.h"
#include "core/reduce.h"
#include "pair_lane.h"
#include "xla_ffi.h"
#include "xla_site.h"

enum { SITES_MAX = 4096, VARIANTS = ACPY_FFI_VARIANTS, MAX_OPERANDS = ACPY_FFI_MAX_OPERANDS, ON_IN = 0, ON_OUT = 1,
       ON_NONE = 2 };
enum { CARRY_TRIES = 64 }; /* calls of a carried op's fallback before its untagged error is the call's */

/* The FFI version this handler declares: the oldest one whose structures it uses (the call frame, buffers,
 * scalar attributes, errors, metadata), which the oldest supported jax (0.10, API 0.3) speaks. XLA refuses
 * a handler that declares a version newer than its own, and the build's jaxlib may be newer than the one
 * that runs it (0.12's headers say 0.5; jax 0.11 runs 0.4). */
#define FFI_MINOR (XLA_FFI_API_MINOR < 3 ? XLA_FFI_API_MINOR : 3)

/* The handlers' entry points: one per custom call target, each a kind number. Which op a kind is, and
 * whether it is a collective, Python says once (ffi_handlers(targets), jax_ext/native_call.py's TARGETS):
 * the names live in Python's table, not copied here. */
enum { KINDS = ACPY_FFI_KINDS };
PyObject *acpy_ffi_kind_names[KINDS]; /* str, owned; NULL: no target */
static int kind_collective[KINDS];   /* 1: a collective (of one rank: its input is its output) */

typedef acpy_ffi_recipe recipe;
typedef acpy_ffi_member member;
typedef acpy_ffi_site site;

_Static_assert((int)ACPY_PAIR_NOT_NOW == (int)ACPY_LANE_NOT_NOW, "one code for 'nothing done' in the fallback");

static site *sites[SITES_MAX];
static int nsites;
uint64_t acpy_ffi_calls_native, acpy_ffi_calls_python;
static uint64_t calls_in_place, calls_carried, calls_busy;

static size_t dtype_bytes(XLA_FFI_DataType t) {
    switch (t) {
    case XLA_FFI_DataType_PRED: case XLA_FFI_DataType_S8: case XLA_FFI_DataType_U8: return 1;
    case XLA_FFI_DataType_S16: case XLA_FFI_DataType_U16: case XLA_FFI_DataType_F16:
    case XLA_FFI_DataType_BF16: return 2;
    case XLA_FFI_DataType_S32: case XLA_FFI_DataType_U32: case XLA_FFI_DataType_F32: return 4;
    case XLA_FFI_DataType_S64: case XLA_FFI_DataType_U64: case XLA_FFI_DataType_F64:
    case XLA_FFI_DataType_C64: return 8;
    case XLA_FFI_DataType_C128: return 16;
    default: return 0;
    }
}

size_t acpy_ffi_bytes(const XLA_FFI_Buffer *b) {
    size_t n = dtype_bytes(b->dtype);
    for (int64_t d = 0; d < b->rank; d++)
        n *= b->dims[d] > 0 ? (size_t)b->dims[d] : 0;
    return n;
}

XLA_FFI_Error *acpy_ffi_fail(const XLA_FFI_CallFrame *cf, XLA_FFI_Error_Code code, const char *msg) {
    XLA_FFI_Error_Create_Args a;
    memset(&a, 0, sizeof a);
    a.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
    a.message = msg;
    a.errc = code;
    return cf->api->XLA_FFI_Error_Create(&a);
}

/* XLA asks a handler which FFI version it was built against before it runs it */
static XLA_FFI_Error *metadata(XLA_FFI_CallFrame *cf) {
    XLA_FFI_Metadata_Extension *ext = (XLA_FFI_Metadata_Extension *)(void *)cf->extension_start;
    if (ext->extension_base.struct_size < XLA_FFI_Metadata_Extension_STRUCT_SIZE || ext->metadata == NULL ||
        ext->metadata->struct_size < XLA_FFI_Metadata_STRUCT_SIZE)
        return acpy_ffi_fail(cf, XLA_FFI_Error_Code_INVALID_ARGUMENT, "aioccl: unexpected XLA FFI metadata layout");
    XLA_FFI_Metadata *md = ext->metadata;
    memset(&md->api_version, 0, sizeof md->api_version);
    md->api_version.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE;
    md->api_version.major_version = XLA_FFI_API_MAJOR;
    md->api_version.minor_version = FFI_MINOR;
    md->traits = 0;
    if (md->struct_size >= offsetof(XLA_FFI_Metadata, state_type_id) + sizeof md->state_type_id)
        memset(&md->state_type_id, 0, sizeof md->state_type_id); /* stateless */
    return NULL;
}

static PyObject *views(XLA_FFI_Buffer *const *bufs, int n) {
    PyObject *list = PyList_New(n);
    for (int k = 0; list != NULL && k < n; k++) {
        PyObject *mv = PyMemoryView_FromMemory(bufs[k]->data, (Py_ssize_t)acpy_ffi_bytes(bufs[k]), PyBUF_WRITE);
        if (mv == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, k, mv);
    }
    return list;
}

/* the exception being raised, taken (NULL if none) */
PyObject *acpy_ffi_take_exception(void) {
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return exc;
#endif
}

/* msg: the XLA error text for exc. is_report: whether it is the fallback's own report (tagged) */
int acpy_ffi_error_text(PyObject *exc, char *msg, size_t size) {
    PyObject *text = exc ? PyObject_Str(exc) : NULL;
    const char *t = text ? PyUnicode_AsUTF8(text) : NULL;
    const char *name = exc ? Py_TYPE(exc)->tp_name : "aioccl: unknown error";
    int is_report = t != NULL && strstr(t, "[jax_ext error ") != NULL;
    if (is_report) /* the fallback's own report: type and all */
        snprintf(msg, size, "%s", t);
    else /* raised around it (a signal's KeyboardInterrupt): name the type, as the report does */
        snprintf(msg, size, "%s%s%s", name, t && *t ? ": " : "", t && *t ? t : "");
    PyErr_Clear();
    Py_XDECREF(text);
    return is_report;
}

/* the GIL, the site's Python fallback(pos, variant, rc, seq, order, ins, outs), the GIL given back.
 * A carried op (rc != ACPY_LANE_NOT_NOW: the core took its numbers, the peers count on it) must be taken on
 * whatever lands on the way in: a signal's exception raised before the fallback took it comes back
 * without the fallback's tag, so the fallback is called again (it takes an op once, however often it is
 * called), and that first interrupt is the call's error once the op has ended. */
static XLA_FFI_Error *fallback(const XLA_FFI_CallFrame *cf, site *s, int pos, int variant, int rc, int64_t seq,
                               int64_t order, XLA_FFI_Buffer *const *ins, int nin, XLA_FFI_Buffer *const *outs,
                               int nout) {
    __atomic_fetch_add(rc == ACPY_LANE_NOT_NOW ? &acpy_ffi_calls_python : &calls_carried, 1, __ATOMIC_RELAXED);
    if (rc == ACPY_LANE_NOT_NOW && acpy_lane_busy)
        __atomic_fetch_add(&calls_busy, 1, __ATOMIC_RELAXED); /* (of the python ones: timing, fast_lane.h) */
    acpy_lane_busy = 0;
    char msg[2048] = "";
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *vin = views(ins, nin), *vout = views(outs, nout), *r = NULL, *held = NULL;
    for (int tries = 0; vin != NULL && vout != NULL; tries++) {
        r = PyObject_CallFunction(s->fallback, "iiiLLOO", pos, variant, rc, (long long)seq, (long long)order, vin,
                                  vout);
        if (r != NULL || rc == ACPY_LANE_NOT_NOW || rc == ACPY_PAIR_SENT || tries == CARRY_TRIES)
            break;
        PyObject *exc = acpy_ffi_take_exception();
        if (acpy_ffi_error_text(exc, msg, sizeof msg)) { /* the op was taken on and has ended: its error */
            Py_XDECREF(exc);
            break;
        }
        *msg = '\0';
        if (held == NULL)
            held = exc;
        else
            Py_XDECREF(exc);
    }
    Py_XDECREF(vin);
    Py_XDECREF(vout);
    if (r == NULL && !*msg) {
        PyObject *exc = acpy_ffi_take_exception();
        acpy_ffi_error_text(exc, msg, sizeof msg);
        Py_XDECREF(exc);
    }
    if (held != NULL) { /* the op ended; the interrupt that kept it waiting is what the caller hears */
        acpy_ffi_error_text(held, msg, sizeof msg);
        Py_DECREF(held);
    }
    Py_XDECREF(r);
    PyGILState_Release(g);
    return *msg ? acpy_ffi_fail(cf, XLA_FFI_Error_Code_INTERNAL, msg) : NULL;
}

static void *pick(int which, XLA_FFI_Buffer *in, XLA_FFI_Buffer *out, size_t *len) {
    XLA_FFI_Buffer *b = which == ON_IN ? in : which == ON_OUT ? out : NULL;
    *len = b ? acpy_ffi_bytes(b) : 0;
    return b ? b->data : NULL;
}

/* A learnt point-to-point op on this call's buffers (the send's is the input, the receive's the output,
 * their sizes checked against the frames by the lane); no source: the output is zeros (ppermute's rule). */
static int pair_call(const member *m, XLA_FFI_Buffer *in, size_t in_len, XLA_FFI_Buffer *out, size_t out_len) {
    acpy_pair_op op = m->op;
    if ((op.dest >= 0 && in == NULL) || (op.source >= 0 && out == NULL))
        return ACPY_PAIR_NOT_NOW;
    if (op.dest >= 0)
        op.send = in->data, op.send_len = in_len;
    if (op.source >= 0)
        op.recv = out->data, op.recv_len = out_len;
    else if (out != NULL && out_len)
        memset(out->data, 0, out_len);
    if (op.dest < 0 && op.source < 0)
        return ACPY_PAIR_DONE;
    return acpy_pair_native(m->pair, &op);
}

XLA_FFI_Error *acpy_ffi_read(XLA_FFI_CallFrame *cf, int kind, acpy_ffi_call *c) {
    const struct { size_t struct_size; int type; } *ext = (const void *)cf->extension_start;
    c->site = NULL;
    if (ext != NULL && ext->type == XLA_FFI_Extension_Metadata)
        return metadata(cf);
    if (cf->stage != XLA_FFI_ExecutionStage_EXECUTE)
        return acpy_ffi_fail(cf, XLA_FFI_Error_Code_INVALID_ARGUMENT, "aioccl: called outside the execute stage");
    int64_t ix = -1;
    for (int64_t i = 0; i < cf->attrs.size; i++) {
        const XLA_FFI_ByteSpan *name = cf->attrs.names[i];
        if (cf->attrs.types[i] == XLA_FFI_AttrType_SCALAR && name->len == 4 && memcmp(name->ptr, "site", 4) == 0) {
            const XLA_FFI_Scalar *sc = cf->attrs.attrs[i];
            if (sc->dtype == XLA_FFI_DataType_S64)
                memcpy(&ix, sc->value, sizeof ix);
        }
    }
    site *s = ix >= 0 && ix < __atomic_load_n(&nsites, __ATOMIC_ACQUIRE) ? sites[ix] : NULL;
    if (s == NULL || s->kind != kind)
        return acpy_ffi_fail(cf, XLA_FFI_Error_Code_FAILED_PRECONDITION,
                    "aioccl: this custom call names no site of this process (a program compiled by another "
                    "process, run without lowering it here?)");
    c->site = s;
    c->nin = c->nout = 0;
    for (int64_t i = 0; i < cf->args.size; i++) {
        XLA_FFI_Buffer *b = cf->args.args[i];
        if (cf->args.types[i] != XLA_FFI_ArgType_BUFFER || c->nin == MAX_OPERANDS)
            return acpy_ffi_fail(cf, XLA_FFI_Error_Code_INVALID_ARGUMENT, "aioccl: unexpected operands");
        if (b->dtype != XLA_FFI_DataType_TOKEN)
            c->ins[c->nin++] = b;
    }
    for (int64_t i = 0; i < cf->rets.size; i++) {
        XLA_FFI_Buffer *b = cf->rets.rets[i];
        if (cf->rets.types[i] != XLA_FFI_RetType_BUFFER || c->nout == MAX_OPERANDS)
            return acpy_ffi_fail(cf, XLA_FFI_Error_Code_INVALID_ARGUMENT, "aioccl: unexpected results");
        if (b->dtype != XLA_FFI_DataType_TOKEN)
            c->outs[c->nout++] = b;
    }
    c->where = c->nin ? c->ins[c->nin - 1] : NULL;
    if (c->where == NULL || c->where->dtype != XLA_FFI_DataType_S32 || c->where->rank != 0)
        return acpy_ffi_fail(cf, XLA_FFI_Error_Code_INVALID_ARGUMENT, "aioccl: the last operand must be the mesh position");
    c->nin--;
    return NULL;
}

static XLA_FFI_Error *handle(XLA_FFI_CallFrame *cf, int kind) {
    acpy_ffi_call c;
    XLA_FFI_Error *err = acpy_ffi_read(cf, kind, &c);
    if (err != NULL || c.site == NULL) /* (the metadata stage) */
        return err;
    site *s = c.site;
    XLA_FFI_Buffer **ins = c.ins, **outs = c.outs, *where = c.where;
    int nin = c.nin, nout = c.nout;
    int32_t pos;
    memcpy(&pos, where->data, sizeof pos);
    if (pos < 0 || pos >= s->nmembers)
        return acpy_ffi_fail(cf, XLA_FFI_Error_Code_OUT_OF_RANGE, "aioccl: mesh position out of range for this site");
    XLA_FFI_Buffer *in = nin ? ins[0] : NULL, *out = nout ? outs[0] : NULL;
    int variant = in != NULL && out != NULL && in->data == out->data;
    if (variant)
        __atomic_fetch_add(&calls_in_place, 1, __ATOMIC_RELAXED);
    member *m = &s->members[pos];
    const recipe *r = &m->r[variant];
    PyObject *lane = __atomic_load_n(&m->lane, __ATOMIC_ACQUIRE); /* (set once, by a first call) */
    int64_t seq = -1, order = -1;
    int rc = ACPY_LANE_NOT_NOW;
    size_t in_len = in ? acpy_ffi_bytes(in) : 0, out_len = out ? acpy_ffi_bytes(out) : 0;
    if (lane != NULL && kind_collective[kind] && in_len == out_len && acpy_lane_alone(lane, &seq)) {
        if (out_len && in->data != out->data)  /* one rank: every collective gives its input back */
            memcpy(out->data, in->data, out_len);
        __atomic_fetch_add(&acpy_ffi_calls_native, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    if (!kind_collective[kind] && __atomic_load_n(&m->pair_ready, __ATOMIC_ACQUIRE)) {
        rc = pair_call(m, in, in_len, out, out_len);
        if (rc == ACPY_PAIR_DONE) {
            __atomic_fetch_add(&acpy_ffi_calls_native, 1, __ATOMIC_RELAXED);
            return NULL;
        }
        return fallback(cf, s, pos, variant, rc, seq, order, ins, nin, outs, nout);
    }
    if (lane != NULL && __atomic_load_n(&r->ready, __ATOMIC_ACQUIRE)) {
        size_t alen, blen;
        void *a = pick(r->in_is, in, out, &alen), *b = pick(r->out_is, in, out, &blen);
        rc = acpy_lane_run_native(lane, (const Program *)r->prog, a, alen, b, blen, r->dtype, r->redop, &seq, &order);
        if (rc == AC_DONE) {
            __atomic_fetch_add(&acpy_ffi_calls_native, 1, __ATOMIC_RELAXED);
            return NULL;
        }
    }
    return fallback(cf, s, pos, variant, rc, seq, order, ins, nin, outs, nout);
}

ACPY_FFI_HANDLERS(h_, HANDLERS)

/* -- the Python side: sites made and taught at lowering and at first calls, under the GIL ---------- */
acpy_ffi_site *acpy_ffi_site_at(PyObject *index) {
    long ix = PyLong_AsLong(index);
    if (ix < 0 || ix >= nsites) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_IndexError, "no such site");
        return NULL;
    }
    return sites[ix];
}

/* ffi_site(op, members, fallback[, gpu_fallback]) -> index */
static PyObject *ffi_site(PyObject *Py_UNUSED(m), PyObject *args) {
    const char *op;
    int n;
    PyObject *fb, *gpu_fb = Py_None;
    if (!PyArg_ParseTuple(args, "siO|O", &op, &n, &fb, &gpu_fb))
        return NULL;
    int kind = -1;
    for (int k = 0; k < KINDS; k++)
        if (acpy_ffi_kind_names[k] != NULL) {
            const char *name = PyUnicode_AsUTF8(acpy_ffi_kind_names[k]);
            if (name == NULL)
                return NULL;
            if (strcmp(op, name) == 0)
                kind = k;
        }
    if (kind < 0 || n < 1 || n > 1 << 16 || !PyCallable_Check(fb) || (gpu_fb != Py_None && !PyCallable_Check(gpu_fb))) {
        PyErr_SetString(PyExc_ValueError, "ffi_site: a known op, 1 to 65536 members, callable fallbacks");
        return NULL;
    }
    if (nsites == SITES_MAX) {
        PyErr_Format(PyExc_RuntimeError, "ffi_site: more than %d distinct jax_ext call sites", SITES_MAX);
        return NULL;
    }
    site *s = PyMem_Calloc(1, sizeof *s);
    member *mem = PyMem_Calloc((size_t)n, sizeof *mem);
    if (s == NULL || mem == NULL) {
        PyMem_Free(s);
        PyMem_Free(mem);
        return PyErr_NoMemory();
    }
    s->kind = kind;
    s->nmembers = n;
    s->members = mem;
    s->fallback = Py_NewRef(fb);
    s->gpu_fallback = gpu_fb != Py_None ? Py_NewRef(gpu_fb) : NULL;
    sites[nsites] = s; /* sites live as long as the process: compiled programs name them */
    __atomic_store_n(&nsites, nsites + 1, __ATOMIC_RELEASE);
    return PyLong_FromLong(nsites - 1);
}

/* ffi_member(index, pos, lane): the Lane of the communicator at mesh position pos */
static PyObject *ffi_member(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *index, *lane;
    int pos;
    if (!PyArg_ParseTuple(args, "OiO!", &index, &pos, &acpy_LaneType, &lane))
        return NULL;
    site *s = acpy_ffi_site_at(index);
    if (s == NULL)
        return NULL;
    if (pos < 0 || pos >= s->nmembers || s->members[pos].lane != NULL) {
        PyErr_SetString(PyExc_ValueError, "ffi_member: position out of range, or set already");
        return NULL;
    }
    __atomic_store_n(&s->members[pos].lane, Py_NewRef(lane), __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

/* ffi_learn(index, pos, variant, program, dtype, redop, in_is, out_is): the native op of that member */
static PyObject *ffi_learn(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *index, *prog;
    int pos, variant, dtype, redop, in_is, out_is;
    if (!PyArg_ParseTuple(args, "OiiO!iiii", &index, &pos, &variant, &acpy_ProgramType, &prog, &dtype, &redop, &in_is,
                          &out_is))
        return NULL;
    site *s = acpy_ffi_site_at(index);
    if (s == NULL)
        return NULL;
    if (pos < 0 || pos >= s->nmembers || variant < 0 || variant >= VARIANTS || dtype < 0 || dtype > AC_DT_LAST ||
        redop < 0 || redop > AC_OP_LAST || in_is < ON_IN || in_is > ON_NONE || out_is < ON_IN || out_is > ON_NONE) {
        PyErr_SetString(PyExc_ValueError, "ffi_learn: an argument out of range");
        return NULL;
    }
    recipe *r = &s->members[pos].r[variant];
    if (__atomic_load_n(&r->ready, __ATOMIC_ACQUIRE))
        Py_RETURN_FALSE; /* learnt already (a handler may be reading it) */
    r->prog = Py_NewRef(prog);
    r->dtype = dtype;
    r->redop = redop;
    r->in_is = in_is;
    r->out_is = out_is;
    __atomic_store_n(&r->ready, 1, __ATOMIC_RELEASE);
    Py_RETURN_TRUE;
}

/* ffi_pair(index, pos, pair_lane, dest, source, tag, send_code, recv_code): the point-to-point op of that
 * member, run by its communicator's PairLane (dest/source -1: no such half) */
static PyObject *ffi_pair(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *index, *pair;
    int pos, dest, source, send_code, recv_code;
    long long tag;
    if (!PyArg_ParseTuple(args, "OiO!iiLii", &index, &pos, &acpy_PairLaneType, &pair, &dest, &source, &tag,
                          &send_code, &recv_code))
        return NULL;
    site *s = acpy_ffi_site_at(index);
    if (s == NULL)
        return NULL;
    if (kind_collective[s->kind] || pos < 0 || pos >= s->nmembers || dest < -1 || source < -1 || tag < 0 ||
        send_code < 0 || send_code > 255 || recv_code < 0 || recv_code > 255) {
        PyErr_SetString(PyExc_ValueError, "ffi_pair: a point-to-point site, a position in range, peers from -1, "
                                          "a tag from 0, dtype codes of a byte");
        return NULL;
    }
    member *mem = &s->members[pos];
    if (__atomic_load_n(&mem->pair_ready, __ATOMIC_ACQUIRE))
        Py_RETURN_FALSE; /* learnt already (a handler may be reading it) */
    mem->pair = Py_NewRef(pair);
    mem->op = (acpy_pair_op){.dest = dest, .source = source, .tag = tag, .send_code = send_code,
                             .recv_code = recv_code};
    __atomic_store_n(&mem->pair_ready, 1, __ATOMIC_RELEASE);
    Py_RETURN_TRUE;
}

/* ffi_handlers(targets): targets a tuple of (op name, is a collective), one kind each, in order; the same
 * every call (the sites made name them): {op name: the capsule of its handler} */
static PyObject *ffi_handlers(PyObject *Py_UNUSED(m), PyObject *targets) {
    Py_ssize_t n = PyTuple_Check(targets) ? PyTuple_GET_SIZE(targets) : -1;
    if (n < 1 || n > KINDS) {
        PyErr_Format(PyExc_ValueError, "ffi_handlers: 1 to %d targets, each (op name, collective)", KINDS);
        return NULL;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *t = PyTuple_GET_ITEM(targets, k);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(t, 0))) {
            PyErr_SetString(PyExc_ValueError, "ffi_handlers: a target is (op name, collective)");
            return NULL;
        }
        if (acpy_ffi_kind_names[k] != NULL && PyUnicode_Compare(acpy_ffi_kind_names[k], PyTuple_GET_ITEM(t, 0)) != 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "ffi_handlers: the targets were named otherwise before");
            return NULL;
        }
    }
    PyObject *d = PyDict_New();
    for (Py_ssize_t k = 0; d != NULL && k < n; k++) {
        PyObject *t = PyTuple_GET_ITEM(targets, k);
        int collective = PyObject_IsTrue(PyTuple_GET_ITEM(t, 1));
        if (collective < 0) {
            Py_CLEAR(d);
            break;
        }
        if (acpy_ffi_kind_names[k] == NULL)
            acpy_ffi_kind_names[k] = Py_NewRef(PyTuple_GET_ITEM(t, 0));
        kind_collective[k] = collective;
        PyObject *cap = PyCapsule_New((void *)HANDLERS[k], NULL, NULL);
        if (cap == NULL || PyDict_SetItem(d, acpy_ffi_kind_names[k], cap) < 0)
            Py_CLEAR(d);
        Py_XDECREF(cap);
    }
    return d;
}

static PyObject *ffi_stats(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(ignored)) {
    return Py_BuildValue("{sKsKsKsKsKsi}", "native", (unsigned long long)__atomic_load_n(&acpy_ffi_calls_native, __ATOMIC_RELAXED),
                         "busy", (unsigned long long)__atomic_load_n(&calls_busy, __ATOMIC_RELAXED),
                         "carried", (unsigned long long)__atomic_load_n(&calls_carried, __ATOMIC_RELAXED), "python",
                         (unsigned long long)__atomic_load_n(&acpy_ffi_calls_python, __ATOMIC_RELAXED), "in_place",
                         (unsigned long long)__atomic_load_n(&calls_in_place, __ATOMIC_RELAXED), "sites", nsites);
}

static PyMethodDef ffi_methods[] = {
    {"ffi_site", ffi_site, METH_VARARGS,
     "ffi_site(op, members, fallback[, gpu_fallback]) -> index (an XLA call site)"},
    {"ffi_member", ffi_member, METH_VARARGS, "ffi_member(index, pos, lane)"},
    {"ffi_learn", ffi_learn, METH_VARARGS, "ffi_learn(index, pos, variant, program, dtype, redop, in_is, out_is)"},
    {"ffi_pair", ffi_pair, METH_VARARGS, "ffi_pair(index, pos, pair_lane, dest, source, tag, send_code, recv_code)"},
    {"ffi_handlers", ffi_handlers, METH_O,
     "ffi_handlers(targets): {op: PyCapsule of its XLA FFI handler}; targets: ((op, collective), ...)"},
    {"ffi_stats", ffi_stats, METH_NOARGS, "calls done natively, started natively and carried on by the engine, run through Python, with output on "
     "input; sites made"},
    {NULL, NULL, 0, NULL},
};

int acpy_xla_ffi_ready(PyObject *m) {
    if (PyModule_AddFunctions(m, ffi_methods) < 0 || acpy_xla_ffi_gpu_ready(m) < 0)
        return -1;
    PyObject *version = PyUnicode_FromFormat("%d.%d", XLA_FFI_API_MAJOR, FFI_MINOR); /* what it declares */
    int rc = version ? PyModule_AddObjectRef(m, "FFI_API", version) : -1;
    Py_XDECREF(version);
    return rc;
}
