/* Cross-memory attach (cma.h). */
#define _GNU_SOURCE
#include "cma.h"

#include <errno.h>
#include <sys/uio.h>

#define AC_CMA_CALL (64u << 20) /* one call moves at most this much: the kernel pins pages as it goes */

/* one direction or the other, in as many calls as the kernel needs */
static int cma_copy(int32_t pid, uint8_t *mine, uint64_t addr, size_t bytes, int write) {
    size_t done = 0;
    while (done < bytes) {
        size_t n = bytes - done < AC_CMA_CALL ? bytes - done : AC_CMA_CALL;
        struct iovec local = {mine + done, n};
        struct iovec remote = {(void *)(uintptr_t)(addr + done), n};
        ssize_t got = write ? process_vm_writev(pid, &local, 1, &remote, 1, 0)
                            : process_vm_readv(pid, &local, 1, &remote, 1, 0);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return errno ? errno : EIO;
        }
        if (got == 0)
            return EFAULT;  /* nothing moved: the rest of the range is not there */
        done += (size_t)got;
    }
    return 0;
}

int ac_cma_read(int32_t pid, void *dst, uint64_t addr, size_t bytes) {
    return cma_copy(pid, (uint8_t *)dst, addr, bytes, 0);
}

int ac_cma_write(int32_t pid, uint64_t addr, const void *src, size_t bytes) {
    /* the kernel only reads the local side of a write: the cast drops a const it keeps */
    return cma_copy(pid, (uint8_t *)(uintptr_t)src, addr, bytes, 1);
}
