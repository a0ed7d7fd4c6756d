/* A shared-memory pair's byte FIFO and its frames (fifo.h). */
#include "fifo.h"

#include <string.h>

#include "jitter.h"

/* little-endian fields of n (4 or 8) bytes: one move each where the machine is little-endian (shared memory
 * is on x86 only), byte by byte elsewhere (a header is packed and unpacked per message: this was a tenth of
 * the instructions of an 8-byte send and receive) */
static void put_le(uint8_t *p, uint64_t v, int n) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(p, &v, n == 8 ? 8 : 4);
#else
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
#endif
}

static uint64_t get_le(const uint8_t *p, int n) {
    uint64_t v = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(&v, p, n == 8 ? 8 : 4);
#else
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
#endif
    return v;
}

/* offsets of "<BBBIQqQqiB4x" */
void ac_frame_pack(const ac_frame *f, uint8_t out[AC_FRAME_HEADER]) {
    out[0] = f->kind, out[1] = f->op, out[2] = f->dtype;
    put_le(out + 3, f->k, 4);
    put_le(out + 7, f->ctx, 8);
    put_le(out + 15, (uint64_t)f->seq, 8);
    put_le(out + 23, f->nbytes, 8);
    put_le(out + 31, (uint64_t)f->count, 8);
    put_le(out + 39, (uint32_t)f->root, 4);
    out[43] = f->redop;
    memset(out + 44, 0, 4);
}

void ac_frame_unpack(const uint8_t in[AC_FRAME_HEADER], ac_frame *f) {
    f->kind = in[0], f->op = in[1], f->dtype = in[2];
    f->k = (uint32_t)get_le(in + 3, 4);
    f->ctx = get_le(in + 7, 8);
    f->seq = (int64_t)get_le(in + 15, 8);
    f->nbytes = get_le(in + 23, 8);
    f->count = (int64_t)get_le(in + 31, 8);
    f->root = (int32_t)(uint32_t)get_le(in + 39, 4);
    f->redop = in[43];
}

static uint64_t load(const uint64_t *w) { return __atomic_load_n(w, __ATOMIC_ACQUIRE); }
static void store(uint64_t *w, uint64_t v) { __atomic_store_n(w, v, __ATOMIC_RELEASE); }

uint64_t ac_fifo_free(const ac_fifo *f) {
    uint64_t head = load(&f->ctl[AC_FIFO_HEAD]), tail = load(&f->ctl[AC_FIFO_TAIL]);
    uint64_t used = head - tail; /* the consumer's tail is the other process's word: checked */
    return used <= f->cap ? f->cap - used : 0;
}

/* copy n bytes in at stream position pos (wrapping round the end) */
static void copy_in(const ac_fifo *f, uint64_t pos, const uint8_t *src, size_t n) {
    size_t at = (size_t)(pos % f->cap), first = n < f->cap - at ? n : (size_t)(f->cap - at);
    memcpy(f->data + at, src, first);
    if (first < n)
        memcpy(f->data, src + first, n - first);
}

int ac_fifo_put_frame(ac_fifo *f, const uint8_t hdr[AC_FRAME_HEADER], const uint8_t *payload, size_t n,
                      size_t piece) {
    if (f->cap < AC_FRAME_HEADER || n > f->cap - AC_FRAME_HEADER)
        return -1; /* never fits: the caller streams it */
    uint64_t head = f->ctl[AC_FIFO_HEAD]; /* mine: only this producer writes it */
    ac_jitter();
    copy_in(f, head, hdr, AC_FRAME_HEADER);
    head += AC_FRAME_HEADER;
    if (piece == 0 || n <= piece) {
        copy_in(f, head, payload, n);
        store(&f->ctl[AC_FIFO_HEAD], head + n);
        return 0;
    }
    store(&f->ctl[AC_FIFO_HEAD], head);
    for (size_t at = 0; at < n; at += piece) {
        size_t part = n - at < piece ? n - at : piece;
        copy_in(f, head, payload + at, part);
        head += part;
        store(&f->ctl[AC_FIFO_HEAD], head);
    }
    return 0;
}

int ac_fifo_peek(const ac_fifo *f, ac_frame *fr) {
    uint64_t tail = f->ctl[AC_FIFO_TAIL], head = load(&f->ctl[AC_FIFO_HEAD]);
    uint64_t avail = head - tail; /* the producer's head is the other process's word: checked */
    if (avail > f->cap || f->cap < AC_FRAME_HEADER)
        return AC_FIFO_CORRUPT;
    if (avail < AC_FRAME_HEADER)
        return AC_FIFO_NOT_YET;
    uint8_t h[AC_FRAME_HEADER];
    size_t at = (size_t)(tail % f->cap), first = AC_FRAME_HEADER < f->cap - at ? AC_FRAME_HEADER : (size_t)(f->cap - at);
    memcpy(h, f->data + at, first);
    if (first < AC_FRAME_HEADER)
        memcpy(h + first, f->data, AC_FRAME_HEADER - first);
    ac_frame_unpack(h, fr);
    if (fr->kind < 1 || fr->kind > AC_FRAME_KINDS || fr->nbytes > AC_FRAME_MAX)
        return AC_FIFO_CORRUPT;
    return avail - AC_FRAME_HEADER >= fr->nbytes ? AC_FIFO_WHOLE : AC_FIFO_PART;
}

void ac_fifo_take(ac_fifo *f, uint8_t *dst, size_t n) {
    uint64_t tail = f->ctl[AC_FIFO_TAIL];
    if (f->cap < AC_FRAME_HEADER || n > f->cap - AC_FRAME_HEADER)
        return; /* no frame this long was peeked whole */
    if (dst != NULL && n) {
        size_t at = (size_t)((tail + AC_FRAME_HEADER) % f->cap);
        size_t first = n < f->cap - at ? n : (size_t)(f->cap - at);
        memcpy(dst, f->data + at, first);
        if (first < n)
            memcpy(dst + first, f->data, n - first);
    }
    ac_jitter();
    store(&f->ctl[AC_FIFO_TAIL], tail + AC_FRAME_HEADER + n);
}

size_t ac_fifo_read(const ac_fifo *f, uint8_t *dst, size_t from, size_t to) {
    uint64_t tail = f->ctl[AC_FIFO_TAIL], avail = load(&f->ctl[AC_FIFO_HEAD]) - tail;
    if (f->cap < AC_FRAME_HEADER || avail > f->cap || avail < AC_FRAME_HEADER || to > f->cap - AC_FRAME_HEADER)
        return from; /* impossible counters, or a frame no FIFO this size holds */
    if (to > avail - AC_FRAME_HEADER)
        to = (size_t)(avail - AC_FRAME_HEADER);
    if (from >= to)
        return from;
    size_t n = to - from, at = (size_t)((tail + AC_FRAME_HEADER + from) % f->cap);
    size_t first = n < f->cap - at ? n : (size_t)(f->cap - at);
    memcpy(dst + from, f->data + at, first);
    if (first < n)
        memcpy(dst + from + first, f->data, n - first);
    return to;
}

uint64_t ac_fifo_flag(const ac_fifo *f, int word) { return load(&f->ctl[word]); }

void ac_fifo_set_flag(ac_fifo *f, int word, uint64_t v) { store(&f->ctl[word], v); }

void ac_fifo_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

void ac_fifo_want(ac_fifo *f, uint64_t serial, const ac_want *w) {
    store(&f->ctl[AC_FIFO_WANT_AT], w->at);
    store(&f->ctl[AC_FIFO_WANT_LEN], w->len);
    store(&f->ctl[AC_FIFO_WANT_TAG], (uint64_t)w->tag);
    store(&f->ctl[AC_FIFO_WANT_CTX], w->ctx);
    store(&f->ctl[AC_FIFO_WANT], serial); /* last (release): a producer that sees it sees the rest */
}

int ac_fifo_unwant(ac_fifo *f, uint64_t serial) {
    store(&f->ctl[AC_FIFO_WANT], 0);
    ac_fifo_fence();
    return load(&f->ctl[AC_FIFO_CLAIM]) == serial;
}

uint64_t ac_fifo_claim(ac_fifo *f, uint64_t len, int64_t tag, uint64_t ctx, ac_want *w) {
    uint64_t serial = load(&f->ctl[AC_FIFO_WANT]);
    if (serial == 0 || load(&f->ctl[AC_FIFO_CLAIM]) == serial || load(&f->ctl[AC_FIFO_HEAD]) != load(&f->ctl[AC_FIFO_TAIL]))
        return 0;
    w->at = load(&f->ctl[AC_FIFO_WANT_AT]);
    w->len = load(&f->ctl[AC_FIFO_WANT_LEN]);
    w->tag = (int64_t)load(&f->ctl[AC_FIFO_WANT_TAG]);
    w->ctx = load(&f->ctl[AC_FIFO_WANT_CTX]);
    if (w->len != len || w->tag != tag || w->ctx != ctx || w->at == 0)
        return 0;
    store(&f->ctl[AC_FIFO_CLAIM], serial);
    ac_fifo_fence();
    return load(&f->ctl[AC_FIFO_WANT]) == serial ? serial : 0; /* gone meanwhile: it will wait for a plain frame */
}
