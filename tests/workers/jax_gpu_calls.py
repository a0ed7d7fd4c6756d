"""jax_ext's CUDA custom call end to end, without a GPU or XLA: the handler (xla_ffi_gpu.c) called with a
synthetic call frame (tests/native/ffi_frame.c, argv[1]) on GPU buffers of the stand-in cupy, whose driver
calls the bridge (tests/native/bridge_cuda.c) carries out on its streams.

    aioccl-run --nproc-per-node 2 tests/workers/jax_gpu_calls.py LIBFFI_FRAME [CALLS]

The first call of the site goes to its GPU fallback (jax_ext/native_gpu.py): the all_reduce runs the
engine's way on views of the buffers, on the frame's stream, and the handler learns it; every later call on
the same buffers and stream is launched by the handler through the GPU lane. Each call's result is read
back and checked in full (exact small integers), in place and into another buffer, and on a mesh-level site
(a member per mesh position: the fallback reads this rank's position, the handler finds the member by the
stream). Prints
``GPU_CALLS OK rank=<r> checks=<n> native=<calls the handler launched itself> python=<fallback calls>``.
"""

from __future__ import annotations

import ctypes
import sys
from types import SimpleNamespace

import cupy as cp
import numpy as np

import aioccl
from aioccl import lowlevel, native
from jax_ext import native_call
from jax_ext.all_reduce import _run
from jax_ext.native_call import Site

S64 = 5  # XLA_FFI_DataType_S64


def main() -> None:
    frame = ctypes.CDLL(sys.argv[1])
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    comm = aioccl.init_sync()
    n, r = comm.world_size, comm.rank
    core = native.core
    assert core is not None and hasattr(core, "ffi_gpu_handlers"), "the native core without CUDA custom calls"
    core.ffi_handlers(native_call.TARGETS)
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    handler = get(core.ffi_gpu_handlers()["all_reduce"], None)
    count = 1000 + 3
    aval = [SimpleNamespace(shape=(count,), dtype=np.float32)]
    stream = cp.cuda.Stream()
    x, out = cp.empty(count, np.float32), cp.empty(count, np.float32)
    base = np.arange(count, dtype=np.float32) % 97
    checks, before = 0, core.ffi_stats()
    def by_position(position):  # a mesh-level site: a communicator per mesh position, this rank's at r
        assert position() == r, "the fallback read another mesh position"
        return comm

    sites = 0
    for in_place, members in ((True, 1), (False, 1), (True, n)):
        site = Site("all_reduce", _run, lambda **_: True, by_position if members > 1 else lambda position: comm,
                    aval, aval, {"op": "sum"})
        site.index = core.ffi_site("all_reduce", members, site.fallback, site.gpu_fallback)
        sites += 1
        target = x if in_place else out
        for it in range(calls):
            with stream:
                x.set(base + r + it)
                if not in_place:
                    out.set(np.full(count, -1, np.float32))
            msg, where = ctypes.create_string_buffer(2048), ctypes.c_int32(r if members > 1 else 0)
            ptrs = (ctypes.c_void_p * 1)(x.data.ptr)
            dst = (ctypes.c_void_p * 1)(target.data.ptr)
            elems = (ctypes.c_int64 * 1)(count)
            rc = frame.ffi_frame_call(ctypes.c_void_p(handler), ctypes.c_longlong(site.index), S64,
                                      ctypes.c_void_p(stream.ptr), 1, ptrs, elems, 1, dst, elems, ctypes.byref(where),
                                      msg, 2048)
            assert rc == 0, msg.value.decode()
            got = target.get(stream)
            want = sum(base + k + it for k in range(n)).astype(np.float32)
            assert np.array_equal(got, want), (f"call {it} in_place={in_place} members={members} on rank {r}: "
                                               f"{got[:4]} != {want[:4]}")
            checks += 1
    after = core.ffi_stats()
    native_calls, python_calls = after["native"] - before["native"], after["python"] - before["python"]
    # the fallback's: each site's first call, and the communicator's first GPU op (its device path and lane
    # are set up during it, so there is no lane launch to learn from it yet)
    assert python_calls <= sites + 1 and native_calls == sites * calls - python_calls, (native_calls, python_calls)
    assert lowlevel.gpu_lane_ran(comm) == native_calls  # every one launched by the lane (the fallbacks' went
    # the general way: the learning must see the op launched)
    print(f"GPU_CALLS OK rank={r} checks={checks} native={native_calls} python={python_calls}", flush=True)
    comm.close().wait()


main()
