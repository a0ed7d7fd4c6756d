"""The GIL while a native op waits: rank 0's counting thread against rank 0 waiting in an all_reduce that
rank 1 joins late (the native core spins for the whole wait: AIOCCL_SHM_SPIN_US is set long).

The pace it is compared with is the counter's while the main thread is as busy without the GIL (hashing in
hashlib, which releases it), so a core taken by the spin is not mistaken for a GIL held."""

import hashlib
import threading
import time

import numpy as np

import aioccl

ROUNDS, WINDOW = 5, 0.25
BLOCK = bytes(4 << 20)
comm = aioccl.init_sync()
count = 0
stop = False


def counter() -> None:
    global count
    while not stop:
        count += 1


t = threading.Thread(target=counter, daemon=True)
t.start()
x = np.ones(2, np.float32)
comm.all_reduce(x).wait()  # learns the call: the next ones take the native fast path
idle, busy = [], []
for _ in range(ROUNDS):
    comm.barrier().wait()
    if comm.rank == 0:
        c0, t0 = count, time.perf_counter()
        while time.perf_counter() < t0 + WINDOW:
            hashlib.sha256(BLOCK).digest()
        idle.append((count - c0) / (time.perf_counter() - t0))
        x[:] = 1
        c0, t0 = count, time.perf_counter()
        comm.all_reduce(x).wait()  # rank 1 comes after WINDOW
        busy.append((count - c0) / (time.perf_counter() - t0))
        assert (x == 2).all(), x
    else:
        time.sleep(2 * WINDOW)
        x[:] = 1
        comm.all_reduce(x).wait()
stop = True
t.join()
if comm.rank == 0:
    shm = comm._state.shm
    native = shm.native.stats["ops"] if shm is not None and shm.native is not None else 0
    print(f"GIL idle {max(idle):.0f}/s busy {max(busy):.0f}/s ratio {max(busy) / max(idle):.2f} "
          f"native ops {native}", flush=True)
comm.close().wait()
