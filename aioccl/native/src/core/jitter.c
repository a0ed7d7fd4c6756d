/* The hang hunter's schedule noise (jitter.h). */
#include "jitter.h"

#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

int ac_jitter_on = 0;
static uint64_t seed;
static unsigned rate = 10; /* percent of points */
static _Thread_local uint64_t state;
static _Atomic unsigned long long hits;

unsigned long long ac_jitter_hits(void) { return hits; }

unsigned ac_jitter_rate(void) { return rate; }

/* splitmix64: each thread's stream from the seed, the rank and the thread's first point */
static uint64_t next(void) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void ac_jitter_init(void) {
    const char *s = getenv("AIOCCL_JITTER");
    if (s == NULL || *s == '\0')
        return;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end != '\0')
        return; /* not a number: off (Python's owner says so, aioccl/native/__init__.py) */
    const char *r = getenv("AIOCCL_JITTER_RATE");
    if (r != NULL && *r != '\0') {
        unsigned long p = strtoul(r, &end, 10);
        if (*end == '\0' && p <= 100)
            rate = (unsigned)p;
    }
    const char *rank = getenv("RANK"); /* the launcher's: one stream per rank for the same seed */
    seed = (uint64_t)v * 0x100000001b3ULL + (rank != NULL ? (uint64_t)strtoull(rank, NULL, 10) + 1 : 0);
    ac_jitter_on = rate > 0;
}

void ac_jitter_point(void) {
    static _Atomic uint64_t threads;
    if (state == 0)
        state = seed ^ (++threads << 48) ^ 1;
    uint64_t r = next();
    if (r % 100 >= rate)
        return;
    hits++;
    r >>= 8;
    unsigned kind = (unsigned)(r % 16);
    if (kind < 10) {
        sched_yield();
    } else {
        /* 1-64 us mostly, a millisecond now and then: the length of a reschedule on a busy core */
        long ns = kind < 15 ? 1000L * (long)(1 + (r >> 4) % 64) : 1000000L;
        nanosleep(&(struct timespec){0, ns}, NULL);
    }
}
