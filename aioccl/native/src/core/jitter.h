/* Randomized schedules for the hang hunter (`make stress`, scripts/stress.py).
 *
 * A race between two processes shows only when one of them is descheduled at the wrong instruction; on an
 * idle machine that happens once in thousands of runs. With AIOCCL_JITTER=<seed> set, every hand-off of the
 * core (a counter published, a FIFO frame put or taken, a wait begun, the gate taken) may first yield the CPU
 * or sleep a few microseconds, chosen by a generator seeded from the seed and the process's rank, so a run's
 * schedule is varied and its seed is what a replay sets again. AIOCCL_JITTER_RATE (percent of points that
 * jitter, default 10) sets how often.
 *
 * Off (the variable unset), a point costs one load of a flag that is never written and a predicted branch. */
#ifndef AIOCCL_JITTER_H
#define AIOCCL_JITTER_H

extern int ac_jitter_on; /* set once by ac_jitter_init, before any channel exists */

void ac_jitter_init(void);  /* reads AIOCCL_JITTER and AIOCCL_JITTER_RATE; idempotent */
void ac_jitter_point(void); /* maybe yield or sleep: only called when ac_jitter_on */
unsigned long long ac_jitter_hits(void); /* points that yielded or slept so far, in this process */
unsigned ac_jitter_rate(void);

static inline void ac_jitter(void) {
    if (__builtin_expect(ac_jitter_on, 0))
        ac_jitter_point();
}

#endif
