/* The lockstep protocol of a same-host communicator's shared-memory channel, in native code.
 *
 * The same protocol as aioccl/engine/executor.py runs for a schedule's lockstep steps (and the same
 * segment layout, aioccl/transport/shm/segment.py), so a native op and a Python op interleave on one channel
 * and a rank on either path meets its peers on the other. Per step s (counting up, never reset):
 *
 *   stage  copy my regions into my slot half s % 2 (once every peer has published s - 1),
 *   publish  store s into my step counter (a release store, then a full fence before the sleepers are
 *            read, so a parked peer is never missed),
 *   wait   until the ranks the step reads from have published s (acquire loads: seeing the counter
 *          means seeing the data staged before it, as an LL line's flag carries its data),
 *   read   fetch or reduce, in rank order, from the peers' slots (or their registered buffers).
 *
 * The first step also writes this rank's descriptor (seq, kind, count, root, registered offsets, in-place
 * addresses) and waits for everyone, so a call issued differently anywhere is found on every rank after
 * one step.
 *
 * Reading in place: a schedule that allows it (zero_copy) skips staging a buffer that peers can read
 * where it lies, and closes with one more step that waits for everyone (so nobody returns a buffer a
 * peer still reads). Two kinds: a registered buffer (comm.alloc: in my segment, peers map it) and, on a
 * channel whose ranks all proved they may read each other's memory (ac_chan_cma), any buffer of at
 * least cma_min bytes: its address goes in the descriptor and peers copy from it with
 * process_vm_readv (one copy where staging costs two, as Open MPI's single-copy shared memory). A
 * broadcast whose root's buffer is read in place, in place on the root (it copies nothing of its own),
 * splits each receiver's copy: the receiver reads the front of each chunk while the root writes the
 * back straight into the receiver's buffer (process_vm_writev), where the receiver offers its address;
 * both decide alike from the descriptors (root_writes), and the closing step waits for the root's writes.
 *
 * Everything read from a peer's memory is checked before use: a descriptor's offsets and lengths must
 * lie inside that peer's mapped segment, and a segment's slot size must fit its mapping. A corrupted
 * or hostile peer yields AC_CORRUPT, never a read outside a mapping.
 *
 * Nothing here calls Python or takes the GIL; waits spin (optionally yielding the CPU) for a bounded
 * time and then return AC_BLOCKED with the step they wait for, and the caller parks (the engine's
 * doorbell) and resumes. */
#ifndef AIOCCL_CHANNEL_H
#define AIOCCL_CHANNEL_H

#include <stddef.h>
#include <stdint.h>

/* segment layout: int64 word indices of the control page (aioccl/transport/shm/segment.py) */
#define AC_CONTROL_BYTES 4096
#define AC_W_HALF 2
#define AC_W_HEAP 3
#define AC_W_PID 4
#define AC_W_HEAP_OFF 5
#define AC_W_SELF 6   /* where the owner maps its segment (a reader proves it may read the owner) */
#define AC_W_NONCE 7  /* ... by finding this random word there */
#define AC_W_CTR 8
#define AC_W_SLEEP 16
#define AC_W_GAVE_UP 24
#define AC_W_DESC 32
#define AC_DESC_LEN 8
#define AC_DESC_FIELDS 8 /* seq, kind, count, root, in offset, out offset, in address, out address */
#define AC_MAX_RANKS 64

/* results of ac_run / ac_resume */
enum {
    AC_DONE = 0,       /* finished: the result is in OUT, my step counter is the op's last step */
    AC_BLOCKED = -1,   /* waiting for a step (ac_chan.blocked_*): park, then ac_resume */
    AC_MISMATCH = -2,  /* a peer's descriptor differs from mine (ac_chan.peer) */
    AC_NOT_CLEAN = -3, /* done, but some rank gave up this op or a later one: the caller decides */
    AC_CORRUPT = -4,   /* a peer's memory holds an impossible value (ac_chan.error) */
    AC_UNSUITABLE = -5,/* this op cannot run here (buffers too small for the program): nothing was sent */
    AC_BELLS = -6,      /* done, and parked peers need their doorbell (ac_chan.bells); else as AC_DONE */
};

/* the collective a program runs (its header's code, aioccl/algorithms/table.py): broadcast's root may
 * write into its receivers' buffers (root_writes in channel.c) */
#define AC_CODE_BROADCAST 2

/* buffers of an op, by the schedule's names */
enum { AC_IN = 0, AC_OUT = 1 };

typedef struct {
    int32_t rank, size;
    uint8_t *seg[AC_MAX_RANKS];     /* every rank's mapped segment */
    size_t seg_len[AC_MAX_RANKS];
    size_t slot[AC_MAX_RANKS][2];   /* byte offset of each slot half */
    size_t half[AC_MAX_RANKS];      /* bytes of a slot half */
    size_t heap_off, heap_len;      /* my registered-buffer heap */
    int32_t pid[AC_MAX_RANKS];      /* every rank's process (ac_chan_cma) */
    size_t cma_min;                 /* 0: never read in place by process_vm_readv, else from this many bytes */
    uint8_t *cma_buf;               /* pieces of peers' buffers, read for a reduction */
    size_t cma_buf_len;
    int64_t spin_ns;                /* how long a wait spins before it returns AC_BLOCKED */
    int64_t slice_ns;               /* 0, or how long one call runs steps before it returns (phase 3) */
    int64_t slice_until, slice_from;
    int yield_cpu;
    /* the op in progress (one at a time: a channel runs its ops in issue order) */
    const int64_t *prog;
    size_t prog_len;
    uint8_t *buf[2];
    size_t buf_len[2];
    size_t item;
    int dtype, redop;
    int64_t order, base, divisor;
    int64_t mine[AC_DESC_FIELDS];
    int64_t descs[AC_MAX_RANKS][AC_DESC_FIELDS];
    int64_t in_off, out_off, in_addr, out_addr;
    size_t pc;                      /* where in the program the op stands */
    int64_t step_index, phase, s, nsteps;
    int first, zero_copy, active;
    int64_t blocked_s;              /* the step it waits for (AC_BLOCKED) */
    int blocked_phase;              /* 0: before staging (all peers, s - 1), 1: the step's wait, 2: the
                                       closing step of a zero-copy op (all peers), 3: nothing: the call
                                       ran its slice (resume when the caller's loop has had a turn) */
    int peer;                       /* AC_MISMATCH: the rank whose descriptor differs */
    uint64_t bells;                 /* channel ranks parked on their doorbell when I published: to ring */
    char error[160];                /* AC_CORRUPT: what was wrong */
    uint8_t *spill;                 /* a reduction's accumulator when its destination is also an input */
    size_t spill_len;
    uint64_t ops, spin_hits, cma_reads, cma_writes;
} ac_chan;

/* Set up over mapped segments; checks each peer's slot size against its mapping. 0, or -1 with
 * ch->error set. */
int ac_chan_init(ac_chan *ch, int rank, int size, uint8_t *const *segs, const size_t *lens,
                 int64_t spin_ns, int yield_cpu);
void ac_chan_free(ac_chan *ch);
/* Let peers read my buffers of at least min_bytes in place, and read theirs (0: never). Only for a
 * channel whose ranks all proved it possible (aioccl/engine/shm/setup.py): every rank either calls it
 * with the same min_bytes or does not. 0, or -1 with ch->error set (a rank's pid word is impossible). */
int ac_chan_cma(ac_chan *ch, size_t min_bytes);
/* A call (ac_run, ac_resume) that has run steps for slice_ns returns AC_BLOCKED in phase 3 before the
 * next one, waiting for nothing: a large op on an event loop's thread lets the loop turn (0: never). */
void ac_chan_slice(ac_chan *ch, int64_t slice_ns);

/* A program is one rank's lockstep schedule, lowered by aioccl/engine/shm/native.py:
 *   header: [AC_PROG_MAGIC, nsteps, zero_copy, divisor, code, algo, count, root, max IN, max OUT]
 *   per step: nstage, (buf, start, stop, slot) x nstage; nwait, rank x nwait;
 *             nreads, per read: kind (0 fetch, 1 reduce), nsrc, (rank, buf, start, stop, slot) x nsrc,
 *                               dst buf, dst start, dst stop;
 *             nscale, (buf, start, stop) x nscale
 * in elements; max IN and OUT bound this rank's own regions (a peer's source region lies in that peer's
 * buffers, checked against its mapping when read). ac_prog_check validates one for a channel of `size`
 * ranks (0, or -1 with a reason). */
#define AC_PROG_MAGIC 0x41434e5031LL /* "ACNP1" */
#define AC_PROG_HEADER 10
int ac_prog_check(const int64_t *prog, size_t len, int rank, int size, char *why, size_t why_len);

/* Run one op from its first step: returns as ac_resume. `inp`/`out` may be the same memory. */
int ac_run(ac_chan *ch, const int64_t *prog, size_t prog_len, void *inp, size_t in_len, void *out,
           size_t out_len, int dtype, int redop, int64_t seq, int64_t order);
/* Go on with the op after AC_BLOCKED (its step may still not be there: AC_BLOCKED again). */
int ac_resume(ac_chan *ch);
/* ac_resume within a slice that ends at slice_until (CLOCK_MONOTONIC ns), not one of its own: the caller's
 * loop gave its turn this long, and the waits between calls spent part of it (0: a slice of its own). */
int ac_resume_until(ac_chan *ch, int64_t slice_until);
/* Forget the op in progress (it failed or was abandoned by the caller). */
void ac_reset(ac_chan *ch);
/* My step counter (the last step I published). */
int64_t ac_step(const ac_chan *ch);

#endif
