"""An op captured in a CUDA graph replays correctly many times (the device path's spin form).

    aioccl-run --nproc-per-node 2 gpu_graph.py

The flags only count up and each launch takes its epoch from them, so a replayed graph (whose kernel
arguments are frozen at capture) still meets its peers at the right piece. Small scratch: the op runs in
several pieces, so one replay advances the epochs several times. In the stream form, capture is refused
with a clear error (its stream waits carry the epoch as a constant). Prints ``GRAPH_OK`` or
``GRAPH_REFUSED``.
"""

from __future__ import annotations

import os
import sys

import cupy as cp
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import aioccl  # noqa: E402

N = 3000


def main() -> None:
    comm = aioccl.init_sync(timeout=60)
    r, n = comm.rank, comm.world_size
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        x = cp.zeros(N, np.float32)
        y = cp.full(N, -1, np.float32)
        z = cp.full(n * 7, -1, np.int32)
        small = cp.full(7, r, np.int32)
    comm.all_reduce(x, out=y, stream=s).wait()  # sets the GPU path up outside the capture
    s.synchronize()
    s.begin_capture()
    try:
        comm.all_reduce(x, out=y, stream=s)
        comm.all_gather(small, out=z, stream=s)
    except aioccl.InvalidArgument as e:
        s.end_capture()
        assert comm._launcher.gpu.path == "ipc/stream", comm._launcher.gpu.path
        assert "CUDA graph" in str(e), e
        print(f"GRAPH_REFUSED rank={r}: {e}", flush=True)
        comm.close().wait()
        return
    graph = s.end_capture()
    for k in range(6):
        with s:
            x[...] = cp.arange(N, dtype=np.float32) % 13 + r + k
            small[...] = r * 100 + k
            y[...] = -1
            z[...] = -1
        graph.launch(s)
        s.synchronize()
        want = sum(np.arange(N, dtype=np.float32) % 13 + q + k for q in range(n))
        np.testing.assert_array_equal(cp.asnumpy(y), want, err_msg=f"replay {k}")
        np.testing.assert_array_equal(cp.asnumpy(z), np.repeat(np.arange(n) * 100 + k, 7).astype(np.int32))
    w = comm.all_reduce(cp.full(5, r + 1, np.int64))  # and ops outside the graph go on after the replays
    got = w.wait()
    cp.cuda.get_current_stream().wait_event(w.event)
    np.testing.assert_array_equal(cp.asnumpy(got), np.full(5, n * (n + 1) // 2))
    print(f"GRAPH_OK rank={r} replays=6 path={comm._launcher.gpu.path}", flush=True)
    comm.close().wait()


main()
