/* Who runs a shared-memory channel's next op: the engine (Python ops, in issue order) or a native caller
 * outside it (the fast lane, an XLA custom call) that found the channel idle.
 *
 * Ops on a channel run one at a time in issue order (the order number taken with the sequence number).
 * The engine admits an op when its number is next and no native caller holds the channel; a native
 * caller claims the channel only when every op issued so far has finished and the engine holds none.
 * All of it under one small lock that never calls anything, so an XLA thread decides without the GIL.
 *
 *   claim   (native) idle, nothing ahead: take the next order number and hold the channel
 *   done    (native) the op finished: the next number is up; whether the engine held an op meanwhile
 *   drop    (native) the op must wait: stop holding, the engine carries it on (it admits it as usual)
 *   admit   (engine) may the op with this number run now? if not, the engine holds it and is told
 *   finish  (engine) an admitted op ended
 *   alarm   (engine) the channel is broken or closing: no more claims */
#ifndef AIOCCL_GATE_H
#define AIOCCL_GATE_H

#include <stdint.h>

typedef struct {
    int lock;
    int64_t order;      /* the next order number to be taken (by anyone) */
    int64_t next;       /* the order number of the op the channel runs next */
    int64_t engine_ops; /* admitted by the engine and not finished */
    int busy;           /* a native caller holds the channel */
    int want;           /* the engine holds an op that waits on the native caller */
    int alarm;          /* broken or closing */
} ac_gate;

void ac_gate_init(ac_gate *g, int64_t order);
/* take an order number for an op the engine will run (1: the caller must admit it later) */
int64_t ac_gate_take(ac_gate *g);
/* 1 and *order set: the caller holds the channel for the op numbered *order */
int ac_gate_claim(ac_gate *g, int64_t *order);
/* the claimed op finished: 1 when the engine must be woken (it holds an op that waited) */
int ac_gate_done(ac_gate *g, int64_t order);
void ac_gate_drop(ac_gate *g);
int ac_gate_admit(ac_gate *g, int64_t order);
void ac_gate_finish(ac_gate *g);
void ac_gate_alarm(ac_gate *g);
/* 1 once the engine raised the alarm */
int ac_gate_alarmed(ac_gate *g);
/* 1 while a native caller holds the channel */
int ac_gate_busy(ac_gate *g);
int64_t ac_gate_next(ac_gate *g);
void ac_gate_set_next(ac_gate *g, int64_t next);

#endif
