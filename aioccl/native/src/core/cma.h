/* Reading a same-host peer process's memory in place (Linux cross-memory attach, process_vm_readv): one
 * copy from its buffer into mine, where staging through shared memory costs two; and writing into it
 * (process_vm_writev), where a broadcast's root shares its receivers' copy. Whether the kernel allows
 * it (same user, Yama's ptrace scope, one pid namespace) is proved once per channel at set-up, in Python
 * (aioccl/transport/cma.py); here it is only done. */
#ifndef AIOCCL_CMA_H
#define AIOCCL_CMA_H

#include <stddef.h>
#include <stdint.h>

/* Copy `bytes` from address `addr` of process `pid` to `dst`, in as many calls as the kernel needs.
 * 0, or the errno of the call that failed (the process is gone, or the range is not mapped there). */
int ac_cma_read(int32_t pid, void *dst, uint64_t addr, size_t bytes);
/* Copy `bytes` from `src` to address `addr` of process `pid`; returns as ac_cma_read. */
int ac_cma_write(int32_t pid, uint64_t addr, const void *src, size_t bytes);

#endif
