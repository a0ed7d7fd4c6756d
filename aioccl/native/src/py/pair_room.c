/* A point-to-point lane's send that finds the FIFO full waits for room (pair_lane_object.h).
 *
 * Why: a sender that streams faster than its receiver takes (a pipeline's first stage) fills the FIFO. A
 * send that then went the general way queued every later send to that peer behind it in the engine (sends
 * keep their order): a task, bells and wake-ups per message for as long as the queue never empties, which
 * in a pipeline is for good (64 KiB microbatches: 120-170 us each against 45-75 in the lane). Waiting here
 * for the receiver to take a frame is the backpressure Open MPI's sends have. The price: an `isend` to a
 * receiver that lags returns once its frame is in, not at once (its receiver sets the pace either way).
 *
 * How long: every caller spins for the pair's spin (and the time its receiver takes to copy this much out,
 * ~4 GB/s), the GIL released, yielding the CPU as the pair's policy says. The engine's own thread then waits
 * on while the receiver keeps taking frames (its tail moves at least every AIOCCL_SHM_STALL_MS, 20 ms) and
 * its loop has nothing else to run: every loop slice (AIOCCL_LOOP_SLICE_US) it asks `wanted`
 * (turns.loop_waits: a ready callback, a due timer, a readable descriptor) and gives up when the loop is
 * wanted, so the loop-lag promise holds. Meanwhile it looks every NAP_NS and sleeps in between (unless
 * AIOCCL_SHM_YIELD=0 gave each rank a core of its own): the stages that work need the CPU more than this
 * one needs to see room at once (a 4-stage pipeline on 2 cores: 1 MiB microbatches in 812 us against 1082
 * spinning, medians of 5 runs).
 *
 * A caller on a borrowed engine or outside Python gives up after the spin: the engine's thread waits for its
 * lock meanwhile. A receiver that stalls (descheduled for long, or gone) ends the wait too, and so does
 * unread data from the receiver in this rank's own FIFO (two ranks that flood each other would each wait for
 * the other to read; a receiver that paused reading says so there). On the engine's thread a send whose wait
 * ended is put off (acpy_pair_put answers 2: engine/p2p/put_off.py tries it again from the loop, through the
 * lane); elsewhere it goes the general way. Giving up is never wrong, only slower. */
#include <sched.h>
#include <time.h>
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL aioccl_native_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include "pair_lane_object.h"

#define NAP_NS 20000L       /* past the spin, a polite rank's sleep between looks */

/* spin until the FIFO has `need` bytes free or `end` came (`nap`: sleeping NAP_NS between looks instead of
 * yielding): 1 room, 0 not */
static int spin_for_room(const PairLane *self, ac_fifo *f, uint64_t need, int64_t end, int nap) {
    int fits = 0;
    Py_BEGIN_ALLOW_THREADS
    while (!(fits = ac_fifo_free(f) >= need) && acpy_pair_now_ns() < end) {
        if (nap)
            nanosleep(&(struct timespec){0, NAP_NS}, NULL);
        else if (self->yield_cpu)
            sched_yield();
    }
    Py_END_ALLOW_THREADS
    return fits;
}

int acpy_pair_room(PairLane *self, ac_fifo *f, const ac_fifo *back, const call *c) {
    uint64_t need = AC_FRAME_HEADER + (uint64_t)c->nbytes;
    if (need > f->cap || self->spin_ns <= 0)
        return 0; /* longer than the FIFO (it streams through: the general way), or no spinning at all */
    int64_t moved = acpy_pair_now_ns();
    uint64_t seen = ac_fifo_flag(f, AC_FIFO_TAIL);
    int fits = spin_for_room(self, f, need, moved + self->spin_ns + (int64_t)(c->nbytes / 4), 0);
    while (!fits && c->owner) {
        uint64_t tail = ac_fifo_flag(f, AC_FIFO_TAIL);
        int64_t t = acpy_pair_now_ns();
        if (tail != seen)
            seen = tail, moved = t;
        else if (t - moved >= self->stall_ns)
            break; /* the receiver stood still (descheduled for long, or gone) */
        if (back == NULL || ac_fifo_flag(back, AC_FIFO_HEAD) != ac_fifo_flag(back, AC_FIFO_TAIL))
            break; /* the receiver sent this rank what it has not read: it may wait for room itself */
        PyObject *w = PyObject_CallNoArgs(self->wanted);
        int wanted = w == NULL ? -1 : PyObject_IsTrue(w);
        Py_XDECREF(w);
        if (wanted != 0)
            return wanted < 0 ? -1 : (self->full++, 0);
        fits = spin_for_room(self, f, need, t + self->slice_ns, self->yield_cpu);
    }
    self->full += !fits;
    return fits;
}
