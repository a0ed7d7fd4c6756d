"""What a hand-off between two processes on one GPU costs, with and without kernels around it.

    aioccl-run --nproc-per-node 2 benchmarks/gpu_handoff.py [ROUNDS]

Each rank's stream ping-pongs on two flag words in CUDA-IPC memory: write mine := k
(``cuStreamWriteValue32``), wait for the peer's >= k (``cuStreamWaitValue32``), ROUNDS times, all
enqueued at once; the host waits for the end. Four forms: stream memory operations only; an 8-byte
device-to-device copy before each write (the copy engine, no kernel); a one-block kernel before each write
(what the stream form's publish launch adds); and a kernel before and after (publish and consume, the
stream form's whole op). Prints ``HANDOFF <form>: <us> us per round``
(rank 0, median of 3). With MPS off the processes are time-sliced on the GPU, and the difference
between the forms says what the kernels cost in such a hand-off (docs/benchmarks.md).
"""

from __future__ import annotations

import ctypes
import sys
import time

import cupy as cp
import numpy as np

import aioccl

D2D = 3  # cudaMemcpyDeviceToDevice
KERNEL = cp.RawKernel(r'extern "C" __global__ void touch(unsigned* p) { if (threadIdx.x == 0) p[1] += 1; }',
                      "touch")


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    comm = aioccl.init_sync(timeout=60)
    r, peer = comm.rank, 1 - comm.rank
    lib = ctypes.CDLL("libcuda.so.1")
    write, wait = lib.cuStreamWriteValue32_v2, lib.cuStreamWaitValue32_v2
    for f in (write, wait):
        f.argtypes = (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint)
    mine = cp.zeros(128, np.uint32)
    handle = np.frombuffer(cp.cuda.runtime.ipcGetMemHandle(mine.data.ptr), np.uint8)
    theirs_h = comm.all_gather(handle).wait().reshape(2, -1)[peer].tobytes()
    theirs = cp.cuda.runtime.ipcOpenMemHandle(theirs_h)
    s = cp.cuda.Stream(non_blocking=True)
    base = 0
    forms = ("stream ops only", "copy, then the hand-off", "kernel, then the hand-off", "kernel, hand-off, kernel")
    for form in forms:
        times = []
        for _ in range(3):
            comm.barrier().wait()
            t0 = time.perf_counter()
            for k in range(base + 1, base + rounds + 1):
                if form.startswith("kernel"):
                    KERNEL((1,), (32,), (mine,), stream=s)
                elif form.startswith("copy"):  # the copy engine instead of a kernel: 8 bytes within my buffer
                    cp.cuda.runtime.memcpyAsync(mine.data.ptr + 256, mine.data.ptr + 8, 8, D2D, s.ptr)
                write(s.ptr, mine.data.ptr, k, 0)
                wait(s.ptr, theirs, k, 0)
                if form.endswith("kernel, hand-off, kernel"):
                    KERNEL((1,), (32,), (mine,), stream=s)
            s.synchronize()
            times.append((time.perf_counter() - t0) / rounds * 1e6)
            base += rounds
        if r == 0:
            print(f"HANDOFF {form}: {float(np.median(times)):.1f} us per round", flush=True)
    comm.barrier().wait()
    cp.cuda.runtime.ipcCloseMemHandle(theirs)
    comm.close()


if __name__ == "__main__":
    main()
