/* The GPU launcher (launch.c): a GPU op's kernel launches on its stream, with their epochs, its CUDA
 * event, and a bounded window of the ops in flight, through the driver's calls (cuda_driver.h). Pure C: the
 * CPython layer (py/gpu_lane.c) owns the Python objects that go with an in-flight slot (the event object the
 * slot's handle belongs to, the op's buffers) and finds them by the slot's index.
 *
 * Spin form: a piece is one kernel (it derives its epoch from its own flag). Stream form: publish, a flag
 * write of the epoch, a wait on every peer's flag, consume. Every op waits for the previous op's event
 * when it goes on another stream, so a communicator's ops reach the GPU in one order. The window keeps each
 * op's event, deadline and epoch for the engine's watch (`oldest`); `recent` names the op of an epoch,
 * read without the mutex. */
#ifndef AIOCCL_LAUNCH_H
#define AIOCCL_LAUNCH_H

#include <pthread.h>

#include "cuda_driver.h"

enum { AC_MAX_ARGS = 32, AC_TRACKED = 1024, AC_RECENT = 4096, AC_MAX_PEERS = 64, AC_LAUNCHER_CLOSED = -2 };

typedef struct {
    cu_handle fn;
    unsigned grid, threads;
    int nargs, epoch_at;
    unsigned long long slots[AC_MAX_ARGS]; /* one argument per 8-byte slot: a 4-byte one is its first half */
    void *params[AC_MAX_ARGS];             /* what cuLaunchKernel reads: the slots' addresses */
} ac_launch;

typedef struct {
    int npieces, stream_form;
    ac_launch *l; /* per piece: the launch (spin), or publish then consume (stream) */
} ac_plan;

enum { AC_SLOT_RESERVED, AC_SLOT_LAUNCHED, AC_SLOT_FAILED };

typedef struct {
    cu_handle event; /* the op's event (the CPython layer gives each slot one) */
    long long seq;
    double deadline, timeout;
    unsigned epoch; /* its last piece's */
    int kind, state;
} ac_tracked;

typedef struct { /* every field atomic: read without the mutex (ac_launcher_recent) */
    unsigned epoch;
    int kind;
    long long seq, timeout_us;
} ac_recent_op;

typedef struct {
    cu_result rc;     /* CU_SUCCESS, a driver error, or AC_LAUNCHER_CLOSED */
    const char *call; /* the call that failed */
} ac_driver_error;

typedef struct {
    int form, rank, nranks, closed;
    unsigned long long own_flag, flags[AC_MAX_PEERS]; /* every rank's flag word as mapped here */
    cu_handle last_stream, last_ev;                     /* the last tracked op's stream (compared only) and event */
    unsigned epoch;                                     /* pieces launched so far (atomic) */
    pthread_mutex_t mu;                                 /* launches: one op's pieces at a time, in epoch order */
    int head, count;                                    /* tracked ops: inflight[(head - count) % AC_TRACKED] the oldest */
    ac_tracked inflight[AC_TRACKED];
    ac_recent_op recent[AC_RECENT];
} ac_launcher;

/* 0, or -1 for arguments out of range (1..AC_MAX_PEERS ranks, rank among them, form 0 spin or 1 stream) */
int ac_launcher_init(ac_launcher *l, int form, int rank, int nranks, const unsigned long long *flags,
                     unsigned epoch);
void ac_launcher_destroy(ac_launcher *l);

/* Under the mutex: the pieces of `p` on `stream`, then the op's event `ev` (NULL: not tracked, a graph's
 * capture). *epoch: the launcher's epoch after it. Blocking in the driver: call without the GIL. */
ac_driver_error ac_launcher_launch(ac_launcher *l, ac_plan *p, cu_handle stream, cu_handle ev, long long seq,
                                   int kind, double timeout, unsigned *epoch);

/* The oldest tracked op, when its event says it is over (or will say no more): retired, its slot index
 * returned; -1 while it runs (or none is tracked). The caller releases what it kept for that slot. */
int ac_launcher_retire(ac_launcher *l);
/* The slot the next op is tracked in, reserved; -1 when every slot is in use (the oldest must end first). */
int ac_launcher_reserve(ac_launcher *l);
/* The newest reservation, given back: its op never reached the launcher. */
void ac_launcher_unreserve(ac_launcher *l, int slot);
/* A reserved slot's op was launched (ok) or failed. */
void ac_launcher_track(ac_launcher *l, int slot, int ok, long long seq, int kind, double timeout, double deadline,
                       unsigned epoch);
/* The oldest tracked op, or NULL. */
ac_tracked *ac_launcher_oldest(ac_launcher *l);
/* Waits until a full window's oldest op may end: its event (launched), or a yield (another thread is still
 * launching it). Blocking: call without the GIL, with what was read of the slot before. */
void ac_launcher_wait(cu_handle event, int launched);
/* The op that ran piece `epoch`: 1 and its seq, kind and timeout; 0 when that epoch is too old. */
int ac_launcher_recent(ac_launcher *l, unsigned epoch, long long *seq, int *kind, double *timeout);
unsigned ac_launcher_epoch(ac_launcher *l);
/* No op launches from now on (one being launched ends first). */
void ac_launcher_close(ac_launcher *l);
/* 1 once closed */
int ac_launcher_closed(ac_launcher *l);

/* "CALL failed: CUDA_ERROR_..." into buf, for a driver error */
const char *ac_driver_error_text(ac_driver_error de, char *buf, size_t len);

#endif
