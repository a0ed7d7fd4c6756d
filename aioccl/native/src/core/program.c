/* A lowered program (a rank's lockstep schedule, channel.h) checked once when it is made, so that running
 * it reads and writes only inside the regions and slots it names. */
#include "channel.h"

#include <stdio.h>

static int bad(char *why, size_t n, const char *what, size_t at) {
    if (why != NULL && n)
        snprintf(why, n, "%s (word %zu)", what, at);
    return -1;
}

int ac_prog_check(const int64_t *p, size_t len, int rank, int size, char *why, size_t why_len) {
    if (len < AC_PROG_HEADER || p[0] != AC_PROG_MAGIC)
        return bad(why, why_len, "not a native program", 0);
    if (rank < 0 || rank >= size || size > AC_MAX_RANKS)
        return bad(why, why_len, "rank out of range", 0);
    int64_t nsteps = p[1], max_len[2] = {p[8], p[9]};
    if (nsteps < 0 || p[3] < 0 || max_len[0] < 0 || max_len[1] < 0 || p[4] < 0 || p[4] > 255 || p[5] < 0 ||
        p[5] > 255 || p[6] < 0)
        return bad(why, why_len, "header field out of range", 1);
    size_t at = AC_PROG_HEADER;
#define NEED(k) do { if ((k) < 0 || (size_t)(k) > len || at > len - (size_t)(k)) return bad(why, why_len, "truncated", at); } while (0)
#define REGION(b, a, z) do { if ((b) != AC_IN && (b) != AC_OUT) return bad(why, why_len, "bad buffer", at); \
        if ((a) < 0 || (a) > (z) || (z) > max_len[(b)]) return bad(why, why_len, "region out of range", at); } while (0)
    for (int64_t i = 0; i < nsteps; i++) {
        NEED(1);
        int64_t nstage = p[at++];
        NEED(nstage >= 0 && nstage <= (1 << 20) ? nstage * 4 : -1);
        for (int64_t k = 0; k < nstage; k++, at += 4) {
            REGION(p[at], p[at + 1], p[at + 2]);
            if (p[at + 3] < 0)
                return bad(why, why_len, "negative slot", at);
        }
        NEED(1);
        int64_t nwait = p[at++];
        NEED(nwait >= 0 && nwait <= size ? nwait : -1);
        for (int64_t k = 0; k < nwait; k++, at++)
            if (p[at] < 0 || p[at] >= size || p[at] == rank)
                return bad(why, why_len, "bad wait rank", at);
        NEED(1);
        int64_t nreads = p[at++];
        if (nreads < 0 || nreads > (1 << 20))
            return bad(why, why_len, "bad read count", at);
        for (int64_t r = 0; r < nreads; r++) {
            NEED(2);
            int64_t kind = p[at], nsrc = p[at + 1];
            at += 2;
            if ((kind != 0 && kind != 1) || nsrc < 1 || nsrc > size || (kind == 0 && nsrc != 1))
                return bad(why, why_len, "bad read", at);
            NEED(nsrc * 5 + 3);
            for (int64_t k = 0; k < nsrc; k++, at += 5) {
                if (p[at] < 0 || p[at] >= size)
                    return bad(why, why_len, "bad source rank", at);
                if (p[at] == rank)
                    REGION(p[at + 1], p[at + 2], p[at + 3]);
                else if ((p[at + 1] != AC_IN && p[at + 1] != AC_OUT) || p[at + 2] < 0 || p[at + 2] > p[at + 3])
                    return bad(why, why_len, "bad peer region", at); /* (its length: against the peer's
                                                                         * mapping, when read) */
                if (p[at + 4] < 0)
                    return bad(why, why_len, "negative slot", at);
            }
            REGION(p[at], p[at + 1], p[at + 2]);
            int64_t w = p[at + 2] - p[at + 1];
            for (int64_t k = 0; k < nsrc; k++) {  /* every source is as long as the destination */
                const int64_t *src = p + at - 5 * (nsrc - k);
                if (src[3] - src[2] != w)
                    return bad(why, why_len, "source and destination lengths differ", at);
            }
            at += 3;
        }
        NEED(1);
        int64_t nscale = p[at++];
        NEED(nscale >= 0 && nscale <= (1 << 20) ? nscale * 3 : -1);
        for (int64_t k = 0; k < nscale; k++, at += 3)
            REGION(p[at], p[at + 1], p[at + 2]);
    }
#undef NEED
#undef REGION
    if (at != len)
        return bad(why, why_len, "trailing words", at);
    return 0;
}
