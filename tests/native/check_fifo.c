/* A shared-memory pair's FIFO in C (core/fifo.c), part of check_core (tests/test_native.py builds it with
 * AddressSanitizer and UBSan):
 *
 *   stream:  a producer thread writes frames of random sizes (some larger than a piece, many wrapping
 *            round the FIFO's end) as fast as they fit; the consumer thread copies each out as it streams
 *            in and takes it once whole, checking its header and every byte, in order;
 *   frames:  a header packs and unpacks to itself, byte for byte as frames.HEADER ("<BBBIQqQqiB4x") lays it;
 *   want:    the single-copy handshake (want, claim, unwant) between a producer and a consumer thread: the
 *            consumer announces some receives and gives up on them after a random spin; the producer
 *            writes a claimed one straight into the receive's buffer and puts a delivered frame, else a
 *            plain one. Every message arrives exactly once, exact, in order, and a delivered frame only
 *            ever for a want the consumer found claimed (or saw delivered before giving up);
 *   fuzz:    peek and take over random and hostile counters and headers (a peer's memory): every answer
 *            is an allowed code and no access leaves the FIFO; put never writes a frame that cannot fit;
 *            a claim over hostile want words claims only a want that is exactly the message's. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fifo.h"

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c); exit(1); } } while (0)

static uint64_t state = 0x243f6a8885a308d3ULL;
static uint64_t rnd(void) { /* splitmix64 */
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

enum { CAP = 4096, FRAMES = 20000, PIECE = 512, MAXLEN = CAP - AC_FRAME_HEADER };

static size_t len_of(int i) { return (size_t)((i * 2654435761u) % (i % 7 == 0 ? MAXLEN + 1 : 200)); }
static uint8_t byte_of(int i, size_t j) { return (uint8_t)(i * 31 + j * 7); }

static void *producer(void *arg) {
    ac_fifo *f = arg;
    uint8_t *payload = malloc(MAXLEN);
    CHECK(payload != NULL);
    for (int i = 0; i < FRAMES; i++) {
        size_t n = len_of(i);
        for (size_t j = 0; j < n; j++)
            payload[j] = byte_of(i, j);
        ac_frame fr = {.kind = AC_FRAME_P2P, .dtype = 7, .k = (uint32_t)i, .ctx = 0xfeedULL, .seq = i, .nbytes = n,
                       .count = -(int64_t)i, .root = -i, .redop = 3};
        uint8_t hdr[AC_FRAME_HEADER];
        ac_frame_pack(&fr, hdr);
        while (ac_fifo_free(f) < AC_FRAME_HEADER + n)
            sched_yield();
        CHECK(ac_fifo_put_frame(f, hdr, payload, n, PIECE) == 0);
    }
    free(payload);
    return NULL;
}

static void test_stream(void) {
    uint64_t *ctl = calloc(AC_FIFO_CTRL_BYTES / 8, 8);
    uint8_t *data = malloc(CAP), *got = malloc(MAXLEN), *got_bytes = malloc(MAXLEN);
    CHECK(ctl != NULL && data != NULL && got != NULL && got_bytes != NULL);
    ac_fifo f = {ctl, data, CAP};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, producer, &f) == 0);
    int parts = 0;
    for (int i = 0; i < FRAMES; i++) {
        ac_frame fr;
        int st;
        size_t n = len_of(i), upto = 0;
        memset(got_bytes, 0xAB, MAXLEN);
        while ((st = ac_fifo_peek(&f, &fr)) != AC_FIFO_WHOLE) {
            CHECK(st == AC_FIFO_NOT_YET || st == AC_FIFO_PART);
            if (st == AC_FIFO_PART) { /* copied out as it streams in, as a spinning receive does */
                parts++;
                size_t was = upto;
                upto = ac_fifo_read(&f, got_bytes, upto, n);
                CHECK(upto >= was && upto <= n);
            }
            sched_yield();
        }
        CHECK(ac_fifo_read(&f, got_bytes, upto, n) == n);
        for (size_t j = 0; j < n; j++)
            CHECK(got_bytes[j] == byte_of(i, j));
        CHECK(fr.kind == AC_FRAME_P2P && fr.dtype == 7 && fr.k == (uint32_t)i && fr.ctx == 0xfeedULL && fr.seq == i);
        CHECK(fr.nbytes == n && fr.count == -(int64_t)i && fr.root == -i && fr.redop == 3);
        memset(got, 0xAB, MAXLEN);
        ac_fifo_take(&f, i % 5 == 4 ? NULL : got, n); /* (NULL: dropped) */
        if (i % 5 != 4)
            for (size_t j = 0; j < n; j++)
                CHECK(got[j] == byte_of(i, j));
    }
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(ctl[AC_FIFO_HEAD] == ctl[AC_FIFO_TAIL]);
    printf("fifo stream: %d frames, %llu bytes through a %d-byte FIFO, %d looks at a frame still coming\n", FRAMES,
           (unsigned long long)ctl[AC_FIFO_HEAD], CAP, parts);
    free(ctl);
    free(data);
    free(got);
    free(got_bytes);
}

enum { WANTS = 20000, WANT_MAX = 200 };
static size_t want_len(int i) { return (size_t)(i * 7919u % WANT_MAX) + 1; }

static void *want_producer(void *arg) {
    ac_fifo *f = arg;
    uint8_t payload[WANT_MAX];
    for (int i = 0; i < WANTS; i++) {
        size_t n = want_len(i);
        for (size_t j = 0; j < n; j++)
            payload[j] = byte_of(i, j);
        ac_frame fr = {.kind = AC_FRAME_P2P, .dtype = 3, .ctx = 0xfeedULL, .seq = i, .nbytes = n};
        uint8_t hdr[AC_FRAME_HEADER];
        while (ac_fifo_free(f) < AC_FRAME_HEADER + n || (i % 2 && ac_fifo_flag(f, AC_FIFO_HEAD) != ac_fifo_flag(f, AC_FIFO_TAIL)))
            sched_yield(); /* (every other message once the last is taken: the consumer may want it meanwhile) */
        for (int k = i % 3; k > 0; k--)
            sched_yield();
        ac_want w;
        if (ac_fifo_claim(f, n, i, 0xfeedULL, &w)) { /* (cross-memory attach, here within one process) */
            CHECK(w.len == n && w.tag == i && w.ctx == 0xfeedULL);
            memcpy((void *)(uintptr_t)w.at, payload, n);
            fr.op = AC_FRAME_DELIVERED, fr.nbytes = 0, fr.count = (int64_t)n;
        }
        ac_frame_pack(&fr, hdr);
        CHECK(ac_fifo_put_frame(f, hdr, payload, (size_t)fr.nbytes, 0) == 0);
    }
    return NULL;
}

static void test_want(void) {
    uint64_t *ctl = calloc(AC_FIFO_CTRL_BYTES / 8, 8);
    uint8_t *data = malloc(CAP), buf[WANT_MAX];
    CHECK(ctl != NULL && data != NULL);
    ac_fifo f = {ctl, data, CAP};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, want_producer, &f) == 0);
    uint64_t serial = 0;
    int delivered = 0, claimed_late = 0;
    for (int i = 0; i < WANTS; i++) {
        size_t n = want_len(i);
        memset(buf, 0xAB, sizeof buf);
        ac_frame fr;
        uint64_t mine = 0;
        int st = ac_fifo_peek(&f, &fr);
        if (i % 4 != 0 && st == AC_FIFO_NOT_YET) {
            mine = ++serial;
            ac_fifo_want(&f, mine, &(ac_want){(uint64_t)(uintptr_t)buf, n, 0xfeedULL, i});
        }
        for (int spins = (int)(rnd() % 40); st != AC_FIFO_WHOLE && spins > 0; spins--) {
            sched_yield();
            st = ac_fifo_peek(&f, &fr);
        }
        if (mine && ac_fifo_unwant(&f, mine) && st != AC_FIFO_WHOLE)
            claimed_late++; /* claimed: its frame is on its way (delivered, or plain if the want was gone) */
        while ((st = ac_fifo_peek(&f, &fr)) != AC_FIFO_WHOLE) /* (or the general way reads it later) */
            sched_yield();
        CHECK(fr.kind == AC_FRAME_P2P && fr.seq == i && fr.ctx == 0xfeedULL && fr.dtype == 3);
        if (fr.op == AC_FRAME_DELIVERED) {
            CHECK(mine != 0 && fr.nbytes == 0 && fr.count == (int64_t)n);
            ac_fifo_take(&f, NULL, 0);
            delivered++;
        } else {
            CHECK(fr.op == 0 && fr.nbytes == n);
            ac_fifo_take(&f, buf, n);
        }
        for (size_t j = 0; j < n; j++)
            CHECK(buf[j] == byte_of(i, j));
    }
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(ctl[AC_FIFO_HEAD] == ctl[AC_FIFO_TAIL] && ctl[AC_FIFO_WANT] == 0);
    printf("fifo want: %d messages, %d written straight into the receive, %d claimed as it gave up\n", WANTS,
           delivered, claimed_late);
    free(ctl);
    free(data);
}

static void test_header_layout(void) {
    ac_frame fr = {.kind = 2, .op = 0, .dtype = 5, .k = 0x01020304u, .ctx = 0x1112131415161718ULL, .seq = -2,
                   .nbytes = 0x2122232425262728ULL, .count = 0x3132333435363738LL, .root = -3, .redop = 9};
    uint8_t h[AC_FRAME_HEADER], want[AC_FRAME_HEADER] = {
        2, 0, 5, 4, 3, 2, 1, 0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11,
        0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x28, 0x27, 0x26, 0x25, 0x24, 0x23, 0x22, 0x21,
        0x38, 0x37, 0x36, 0x35, 0x34, 0x33, 0x32, 0x31, 0xfd, 0xff, 0xff, 0xff, 9, 0, 0, 0, 0};
    ac_frame_pack(&fr, h);
    CHECK(memcmp(h, want, AC_FRAME_HEADER) == 0);
    ac_frame back;
    ac_frame_unpack(h, &back);
    CHECK(back.kind == 2 && back.dtype == 5 && back.k == fr.k && back.ctx == fr.ctx && back.seq == -2);
    CHECK(back.nbytes == fr.nbytes && back.count == fr.count && back.root == -3 && back.redop == 9);
}

static uint64_t hostile_word(uint64_t near) {
    switch (rnd() % 6) {
    case 0: return near + rnd() % 128;
    case 1: return near - rnd() % 128;
    case 2: return UINT64_MAX - rnd() % 4;
    case 3: return (uint64_t)1 << (rnd() % 64);
    case 4: return near + CAP + rnd() % 8;
    default: return rnd();
    }
}

/* A claim over hostile want words (the consumer's): it claims only a want exactly this message's */
static void fuzz_claim(uint64_t *ctl) {
    for (int k = AC_FIFO_WANT; k <= AC_FIFO_CLAIM; k++)
        ctl[k] = rnd() % 4 ? hostile_word(rnd() % 64) : rnd();
    if (rnd() % 2)
        ctl[AC_FIFO_HEAD] = ctl[AC_FIFO_TAIL];
    uint64_t len = rnd() % 2 ? ctl[AC_FIFO_WANT_LEN] : rnd() % 64, ctx = rnd() % 2 ? ctl[AC_FIFO_WANT_CTX] : 7;
    int64_t tag = rnd() % 2 ? (int64_t)ctl[AC_FIFO_WANT_TAG] : 5;
    ac_fifo f = {ctl, NULL, 64};
    ac_want w;
    uint64_t got = ac_fifo_claim(&f, len, tag, ctx, &w);
    if (got)
        CHECK(got == ctl[AC_FIFO_WANT] && ctl[AC_FIFO_CLAIM] == got && w.len == len && w.tag == tag && w.ctx == ctx &&
              w.at != 0 && ctl[AC_FIFO_HEAD] == ctl[AC_FIFO_TAIL]);
}

static void test_fuzz(int iterations) {
    int counts[4] = {0, 0, 0, 0};
    size_t caps[] = {64, 128, CAP};
    for (int it = 0; it < iterations; it++) {
        size_t cap = caps[rnd() % 3];
        uint64_t *ctl = calloc(AC_FIFO_CTRL_BYTES / 8, 8);
        uint8_t *data = malloc(cap), *dst = malloc(cap);
        CHECK(ctl != NULL && data != NULL && dst != NULL);
        for (size_t j = 0; j < cap; j++)
            data[j] = (uint8_t)rnd();
        if (rnd() % 2) { /* a plausible header at the tail, with a hostile length or kind */
            ac_frame fr = {.kind = (uint8_t)(rnd() % 16), .nbytes = hostile_word(rnd() % cap), .seq = (int64_t)rnd()};
            uint8_t h[AC_FRAME_HEADER];
            ac_frame_pack(&fr, h);
            size_t at = rnd() % cap;
            for (size_t j = 0; j < AC_FRAME_HEADER; j++)
                data[(at + j) % cap] = h[j];
            ctl[AC_FIFO_TAIL] = at + cap * (rnd() % 1000);
        } else {
            ctl[AC_FIFO_TAIL] = rnd();
        }
        ctl[AC_FIFO_HEAD] = hostile_word(ctl[AC_FIFO_TAIL]);
        if (rnd() % 3 == 0) { /* published exactly up to the end of the frame its header claims */
            ac_frame claimed;
            uint8_t h[AC_FRAME_HEADER];
            for (size_t j = 0; j < AC_FRAME_HEADER; j++)
                h[j] = data[(ctl[AC_FIFO_TAIL] + j) % cap];
            ac_frame_unpack(h, &claimed);
            ctl[AC_FIFO_HEAD] = ctl[AC_FIFO_TAIL] + AC_FRAME_HEADER + claimed.nbytes;
        }
        ac_fifo f = {ctl, data, cap};
        ac_frame fr;
        int st = ac_fifo_peek(&f, &fr);
        CHECK(st >= AC_FIFO_CORRUPT && st <= AC_FIFO_PART);
        counts[st + 1]++;
        if (st == AC_FIFO_WHOLE) {
            CHECK(fr.nbytes <= cap - AC_FRAME_HEADER && fr.kind >= 1 && fr.kind <= AC_FRAME_KINDS);
            uint64_t tail = ctl[AC_FIFO_TAIL];
            ac_fifo_take(&f, dst, (size_t)fr.nbytes);
            CHECK(ctl[AC_FIFO_TAIL] == tail + AC_FRAME_HEADER + fr.nbytes);
        }
        size_t from = (size_t)(rnd() % (2 * cap)), to = (size_t)(rnd() % (2 * cap));
        size_t upto = ac_fifo_read(&f, dst, from < cap ? from : 0, to); /* any range: only what lies in the FIFO */
        CHECK(upto <= cap - AC_FRAME_HEADER || upto == (from < cap ? from : 0));
        ac_fifo_take(&f, dst, (size_t)(rnd() % (2 * cap))); /* a caller's wrong length: clamped, never past the FIFO */
        uint64_t free_now = ac_fifo_free(&f);
        CHECK(free_now <= cap);
        size_t n = (size_t)(rnd() % (2 * cap));
        uint8_t hdr[AC_FRAME_HEADER] = {0};
        int put = ac_fifo_put_frame(&f, hdr, dst, n < cap ? n : cap, 64);
        CHECK(put == 0 || (n < cap ? n : cap) > cap - AC_FRAME_HEADER);
        fuzz_claim(ctl);
        free(ctl);
        free(data);
        free(dst);
    }
    printf("fuzz fifo: %d runs: corrupt %d, not yet %d, whole %d, part %d\n", iterations, counts[0], counts[1],
           counts[2], counts[3]);
}

void test_fifo(int iterations) {
    test_header_layout();
    test_stream();
    test_want();
    test_fuzz(iterations);
}
