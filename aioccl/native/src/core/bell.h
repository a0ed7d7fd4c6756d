/* Doorbells rung from C: a datagram to a parked rank's unix socket wakes its engine (transport/shm/segment.py's
 * LoopBell listens). A bell that is full has rung already; a vanished peer is found by its connection. */
#ifndef AIOCCL_BELL_H
#define AIOCCL_BELL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>

typedef struct ac_bell {
    struct sockaddr_un addr;
    socklen_t len;
} ac_bell;

/* Fills `bell` with the unix socket address `path` (`len` bytes, an abstract name may start with NUL);
 * -1 when it does not fit. */
int ac_bell_set(ac_bell *bell, const char *path, size_t len);

/* Rings, from socket `fd`, the bells of the ranks whose bit is set in `mask` (bit j: bells[j], j < n);
 * never blocks. A no-op without bells or a socket. */
void ac_bell_ring(int fd, const ac_bell *bells, int n, uint64_t mask);

#endif
