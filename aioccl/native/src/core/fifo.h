/* One direction of a same-host pair: the byte FIFO of aioccl/transport/shm/fifo.py, and the 48-byte frame
 * header of aioccl/transport/frames.py laid on it, for point-to-point messages sent and taken in C.
 *
 * Layout (u64 words from the FIFO's base): head at word 0 (bytes ever published, the producer's), tail at
 * word 8 (bytes ever consumed, the consumer's), blocked at 16 (the producer waits for space), watching at
 * 24 (the consumer spins on the FIFO and needs no bell), each on its own cache line, with quiet at 25
 * (the consumer's, beside watching: its engine waits for no point-to-point message from this producer, so
 * the lane's point-to-point frame needs no bell either: it waits in the FIFO for the consumer's lane, or
 * for the engine to read it in once a receive is posted or a frame behind it rings); then `cap` bytes of
 * data, a byte at head % cap. The producer copies, then stores head (release): a consumer that loads head
 * (acquire) sees the bytes before it. Frames are written as on a socket: header, then payload.
 *
 * Both counters come from memory another process writes: every reader checks head - tail <= cap before
 * it uses them, and a header's length against what was published, so a corrupt or hostile peer gives
 * AC_FIFO_CORRUPT, never an access outside the FIFO. Nothing here calls Python or blocks. */
#ifndef AIOCCL_FIFO_H
#define AIOCCL_FIFO_H

#include <stddef.h>
#include <stdint.h>

#define AC_FIFO_CTRL_BYTES 256
enum { AC_FIFO_HEAD = 0, AC_FIFO_TAIL = 8, AC_FIFO_BLOCKED = 16, AC_FIFO_WATCHING = 24, AC_FIFO_QUIET = 25 };
/* The consumer's *want* (words 26-30, its line): a receive waiting for its message, whose producer may
 * write the payload straight into the receive's buffer (cross-memory attach: one copy instead of two) and
 * put a header-only frame marked delivered. The producer's *claim* at 31. Dekker's handshake: the producer
 * claims, fences, and looks that the want still stands; the consumer takes it back, fences, and looks for
 * a claim, and if it finds one it waits for the producer's next frame (delivered, or a plain frame if the
 * producer saw the want gone). Serials are never reused, so a want seen late reads as gone. */
enum { AC_FIFO_WANT = 26, AC_FIFO_WANT_AT = 27, AC_FIFO_WANT_LEN = 28, AC_FIFO_WANT_TAG = 29,
       AC_FIFO_WANT_CTX = 30, AC_FIFO_CLAIM = 31 };
#define AC_FRAME_DELIVERED 1 /* a P2P frame's op: no payload, `count` bytes were written into the receive */
#define AC_FRAME_HEADER 48
#define AC_FRAME_MAX ((uint64_t)1 << 46) /* frames.MAX_FRAME: a longer payload is a corrupt header */
#define AC_FRAME_P2P 2                    /* frames.P2P: a point-to-point message */
#define AC_FRAME_KINDS 12                 /* kinds 1..12 exist (frames.KIND_NAMES) */

typedef struct {
    uint64_t *ctl;  /* the control block: AC_FIFO_CTRL_BYTES, its words as above */
    uint8_t *data;  /* cap bytes */
    uint64_t cap;
} ac_fifo;

typedef struct {
    uint8_t kind, op, dtype, redop;
    uint32_t k;
    uint64_t ctx, nbytes;
    int64_t seq, count;
    int32_t root;
} ac_frame;

enum { AC_FIFO_CORRUPT = -1, AC_FIFO_NOT_YET = 0, AC_FIFO_WHOLE = 1, AC_FIFO_PART = 2 };

/* frames.HEADER ("<BBBIQqQqiB4x"): little-endian, no padding but the last 4 bytes */
void ac_frame_pack(const ac_frame *f, uint8_t out[AC_FRAME_HEADER]);
void ac_frame_unpack(const uint8_t in[AC_FRAME_HEADER], ac_frame *f);

/* Producer: bytes free now (0 when the consumer's tail is impossible: nothing fits a corrupt FIFO). */
uint64_t ac_fifo_free(const ac_fifo *f);
/* Producer: copies header and payload (the caller checked they fit: ac_fifo_free) and publishes them: at
 * once up to `piece` bytes of payload, else the header and then each `piece`, so the consumer copies one
 * out while the next comes in. 0, or -1 for a frame longer than the FIFO (nothing written). */
int ac_fifo_put_frame(ac_fifo *f, const uint8_t hdr[AC_FRAME_HEADER], const uint8_t *payload, size_t n,
                      size_t piece);
/* Consumer: the frame at the tail. AC_FIFO_WHOLE: its header in *fr and its payload published too;
 * AC_FIFO_PART: its header (in *fr), not all its payload yet; AC_FIFO_NOT_YET: not even the header;
 * AC_FIFO_CORRUPT: counters or header no producer writes (an unknown kind, a length past MAX_FRAME). */
int ac_fifo_peek(const ac_fifo *f, ac_frame *fr);
/* Consumer, after AC_FIFO_WHOLE for a frame of `n` payload bytes: copies the payload into dst (NULL: drops
 * it) and frees the frame (tail stored after the copy: the producer may then overwrite it). */
void ac_fifo_take(ac_fifo *f, uint8_t *dst, size_t n);
/* Consumer, while the frame at the tail streams in: copies its payload bytes [from, to) into dst + from,
 * only those published (returns how far it copied: `from` when nothing new, never past `to`). */
size_t ac_fifo_read(const ac_fifo *f, uint8_t *dst, size_t from, size_t to);
/* A receive the consumer waits for: where its buffer is (in the consumer's address space), its length, tag
 * and communicator */
typedef struct {
    uint64_t at, len, ctx;
    int64_t tag;
} ac_want;
/* Consumer: announce the receive `w` (serial: nonzero, never used before). */
void ac_fifo_want(ac_fifo *f, uint64_t serial, const ac_want *w);
/* Consumer: take announcement `serial` back; 1 when a producer claimed it (its next frame is on its way:
 * wait for that frame), else 0. */
int ac_fifo_unwant(ac_fifo *f, uint64_t serial);
/* Producer: claim the consumer's announcement if it is for this message (len, tag, ctx) and nothing unread
 * lies before it in the FIFO: its serial (write the payload to w->at, then put the delivered frame; on a
 * failure, put the message as a plain frame instead), or 0 (put it as a plain frame). It only reads what
 * the consumer wrote: a hostile consumer can at most have the payload written into its own memory. */
uint64_t ac_fifo_claim(ac_fifo *f, uint64_t len, int64_t tag, uint64_t ctx, ac_want *w);
/* Either side: the flag words (blocked, watching, quiet), and a full fence (a store before it is seen by every
 * other core before any load after it: publish, fence, look). */
uint64_t ac_fifo_flag(const ac_fifo *f, int word);
void ac_fifo_set_flag(ac_fifo *f, int word, uint64_t v);
void ac_fifo_fence(void);

#endif
