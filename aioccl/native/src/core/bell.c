/* Doorbells rung from C (bell.h). */
#include "bell.h"

#include <string.h>

int ac_bell_set(ac_bell *bell, const char *path, size_t len) {
    if (len > sizeof bell->addr.sun_path)
        return -1;
    memset(bell, 0, sizeof *bell);
    bell->addr.sun_family = AF_UNIX;
    memcpy(bell->addr.sun_path, path, len);
    bell->len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
    return 0;
}

void ac_bell_ring(int fd, const ac_bell *bells, int n, uint64_t mask) {
    if (bells == NULL || fd < 0)
        return;
    for (int j = 0; mask && j < n && j < 64; j++, mask >>= 1)
        if (mask & 1)
            (void)sendto(fd, "!", 1, MSG_DONTWAIT, (const struct sockaddr *)&bells[j].addr, bells[j].len);
}
