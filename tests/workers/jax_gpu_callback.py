"""jax_ext's host callback on the GPU platform: XLA buffers viewed zero-copy, ops on XLA's stream.

    aioccl-run --nproc-per-node 2 jax_gpu_callback.py

Calls the callbacks that jax_ext lowers to, as XLA would on GPU (device
buffers with ``__cuda_array_interface__``, a context with ``stream``), for
all_reduce (in and out of place, bfloat16 included), all_gather, ppermute's
zero fill, and reads the device-side mesh position. With tests/fakecupy it
checks the wiring on any machine; on a GPU, JAX itself runs jax_process.py.
Prints ``JAXGPU OK <checks>``.
"""

from __future__ import annotations

import importlib
import os
import sys

import cupy as cp
import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import aioccl  # noqa: E402
import jax_ext  # noqa: E402,F401 - registers the primitives
from jax_ext._compat import LoweringInfo  # noqa: E402
from jax_ext._primitive import STATS, callback_factory, comm_group  # noqa: E402

from _check import data, poison, reduced  # noqa: E402

BF16_CHECK_DTYPE = ml_dtypes.bfloat16

ar_mod, ag_mod, pp_mod = (importlib.import_module(f"jax_ext.{m}") for m in ("all_reduce", "all_gather", "ppermute"))
comm = aioccl.init_sync(timeout=60)
r, n = comm.rank, comm.world_size
GPU = LoweringInfo("cuda", None)
try:
    from cupy.cuda._gpu import GPU as _FAKE_GPU  # tests/fakecupy's late streams
    _hold = _FAKE_GPU.submit
except ImportError:
    _hold = None
XLA_STREAM = cp.cuda.Stream(non_blocking=True)  # XLA's compute stream: ordered with nothing but itself
checks = 0


class XlaBuffer:
    """What XLA hands a GPU buffer callback: CAI, shape, a numpy dtype (bfloat16 included)."""

    def __init__(self, host: np.ndarray) -> None:
        self.dtype = host.dtype
        self.shape = host.shape
        if _hold is not None:  # XLA's stream well behind the host, as when a long kernel runs
            _hold(XLA_STREAM.ptr, None, after_s=0.02)
        with XLA_STREAM:  # an earlier XLA kernel wrote it
            self.storage = cp.asarray(host.view(np.uint16) if host.dtype.name == "bfloat16" else host)

    @property
    def __cuda_array_interface__(self) -> dict:
        return self.storage.__cuda_array_interface__

    def get(self) -> np.ndarray:
        return self.storage.get(stream=XLA_STREAM).view(self.dtype)  # a later XLA kernel reads it


class Ctx:
    stream = XLA_STREAM.ptr


def check(what: str, got: np.ndarray, want: np.ndarray) -> None:
    global checks
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (what, got, want)
    checks += 1


pos = XlaBuffer(np.array(0, dtype=np.int32))
for dt in (np.float32, np.int64, BF16_CHECK_DTYPE):
    host = callback_factory("all_reduce", ar_mod._run)(GPU, group=comm_group(comm), op="sum")
    x, out = XlaBuffer(data(r, 6, dt)), XlaBuffer(poison(6, dt))
    host(Ctx(), [x, pos], [out])
    check(f"all_reduce {np.dtype(dt).name}", out.get(), reduced(n, 6, dt, "sum"))
    before = STATS["in_place"]
    host(Ctx(), [out, pos], [out])  # XLA aliased the output onto the input
    assert STATS["in_place"] == before + 1
    check(f"all_reduce in place {np.dtype(dt).name}", out.get(), (reduced(n, 6, dt, "sum").astype(np.float64) * n)
          .astype(dt))
host = callback_factory("all_gather", ag_mod._run)(GPU, group=comm_group(comm))
out = XlaBuffer(poison(2 * n, np.int32))
host(Ctx(), [XlaBuffer(data(r, 2, np.int32)), pos], [out])
check("all_gather", out.get(), np.concatenate([data(i, 2, np.int32) for i in range(n)]))
host = callback_factory("ppermute", pp_mod._run)(GPU, group=comm_group(comm), perm=((0, 1),))
out = XlaBuffer(poison(3, BF16_CHECK_DTYPE))
host(Ctx(), [XlaBuffer(data(r, 3, BF16_CHECK_DTYPE)), pos], [out])
check("ppermute", out.get(), data(0, 3, BF16_CHECK_DTYPE) if r == 1 else np.zeros(3, BF16_CHECK_DTYPE))
comm.close().wait(30)
print(f"JAXGPU OK {checks}", flush=True)
