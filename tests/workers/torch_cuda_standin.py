"""torch CUDA tensors as aioccl's GPU path sees them, on a machine without CUDA (tests/fakecupy + CPU torch).

    PYTHONPATH=tests/fakecupy python torch_cuda_standin.py

``FakeCudaTensor`` shows exactly the parts of a torch CUDA tensor that aioccl reads (device, detach, view,
dtype, ``__cuda_array_interface__``, raising as torch does for bfloat16 and for tensors that require grad),
and ``torch.cuda.current_stream`` is pointed at a stream of the stand-in. The end-to-end run against Gloo
on real CUDA tensors is ``torch_c10d.py cuda`` on a GPU machine. Prints ``TORCHCUDA OK <checks>``.
"""

from __future__ import annotations

import types

import cupy as cp
import ml_dtypes
import numpy as np
import torch
from cupy.cuda._gpu import GPU

import aioccl
from aioccl.bootstrap.unique_id import UniqueId
from aioccl.gpu.arrays import adapt_device, is_device_object

TORCH_STREAM = cp.cuda.Stream(non_blocking=True)  # torch's current stream on cuda:0, in this stand-in
torch.cuda.current_stream = lambda device=None: types.SimpleNamespace(cuda_stream=TORCH_STREAM.ptr)
TYPESTR = {torch.float32: "<f4", torch.int16: "<i2", torch.int64: "<i8"}


class FakeCudaTensor:
    __module__ = "torch"

    def __init__(self, storage: cp.ndarray, dtype: torch.dtype, requires_grad: bool = False) -> None:
        self.storage, self.dtype, self.requires_grad = storage, dtype, requires_grad
        self.device = torch.device("cuda", 0)
        self.shape = storage.shape

    def detach(self) -> FakeCudaTensor:
        return FakeCudaTensor(self.storage, self.dtype)

    def view(self, dtype: torch.dtype) -> FakeCudaTensor:
        return FakeCudaTensor(self.storage, dtype)

    @property
    def __cuda_array_interface__(self) -> dict:
        if self.requires_grad:
            raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad.")
        if self.dtype not in TYPESTR:
            raise TypeError(f"dtype {self.dtype} is not supported by the CUDA array interface")
        return {**self.storage.__cuda_array_interface__, "typestr": TYPESTR[self.dtype]}


checks = 0


def check(what: str, ok: bool) -> None:
    global checks
    assert ok, what
    checks += 1


bits = np.arange(1, 7, dtype=np.float32).astype(ml_dtypes.bfloat16).view(np.int16)
with TORCH_STREAM:  # written by torch's kernels, on torch's stream
    bf16 = FakeCudaTensor(cp.asarray(bits), torch.bfloat16, requires_grad=True)
    f32 = FakeCudaTensor(cp.asarray(np.arange(4, dtype=np.float32)), torch.float32, requires_grad=True)
check("a CUDA tensor is device memory", is_device_object(bf16) and is_device_object(f32))
check("a CPU tensor is not", not is_device_object(torch.ones(3)))
arr, writable, _wrap, _ = adapt_device(bf16, "x")
check("bfloat16 keeps its logical dtype, stored as uint16",
      arr.dtype == np.dtype(ml_dtypes.bfloat16) and arr.data.dtype == np.uint16 and writable)
check("ordered on torch's current stream", arr.stream == TORCH_STREAM.ptr)
comm = aioccl.Communicator.create_sync(UniqueId.new(host="127.0.0.1"), 0, 1, 30)
before = GPU.queue(TORCH_STREAM.ptr).next_seq
got = comm.all_reduce(f32, "sum").wait(30)
check("in place: the tensor itself comes back", got is f32)
check("the op's copies went on torch's stream", GPU.queue(TORCH_STREAM.ptr).next_seq > before)
check("results in place", np.array_equal(f32.storage.get(), np.arange(4, dtype=np.float32)))
out = comm.all_reduce(bf16, "max").wait(30)
check("bfloat16 all_reduce", np.array_equal(bf16.storage.get(), bits) and out is bf16)
comm.close().wait(30)
print(f"TORCHCUDA OK {checks}", flush=True)
