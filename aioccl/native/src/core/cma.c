/* Cross-memory attach (cma.h). */
#define _GNU_SOURCE
#include "cma.h"

#include <errno.h>
#include <sys/uio.h>

#define AC_CMA_CALL (64u << 20) /* one call moves at most this much: the kernel pins pages as it goes */

int ac_cma_read(int32_t pid, void *dst, uint64_t addr, size_t bytes) {
    size_t done = 0;
    while (done < bytes) {
        size_t n = bytes - done < AC_CMA_CALL ? bytes - done : AC_CMA_CALL;
        struct iovec local = {(uint8_t *)dst + done, n};
        struct iovec remote = {(void *)(uintptr_t)(addr + done), n};
        ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
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
