"""torch CPU tensors, viewed in place through DLPack.

torch is never imported here: a tensor can only reach us if the caller
already imported it, so ``sys.modules`` has it. Two details need more than a
plain ``np.from_dlpack``: tensors that require grad refuse to export (so we
view ``detach()``, which shares the storage; like torch.distributed, the op
is invisible to autograd), and numpy has no bfloat16 for DLPack to name (so
bfloat16 travels as int16 bits and is re-labelled with ml_dtypes' bfloat16).
CUDA tensors never come here; ``aioccl.gpu.arrays`` takes them first.

It sits beside ``buffers.py``, below the engine: registering the ``torch.distributed`` backend is
``aioccl/__init__.py``'s business (``interop/c10d``, at the top), never a side effect of viewing a tensor.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from .dtypes import bfloat16, is_bfloat16
from .errors import InvalidArgument


def is_tensor(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "__dlpack__")


def view(x: Any, name: str) -> np.ndarray:
    """A numpy view of ``x``'s memory (writable: results land in the tensor)."""
    torch = sys.modules["torch"]
    t = x.detach()
    if t.layout == torch.strided and t.is_contiguous() and t.dtype != torch.bfloat16:
        try:
            arr: np.ndarray = t.numpy()  # a CPU tensor of a dtype numpy has: 1 us, against DLPack's 4
            return arr
        except (RuntimeError, TypeError):
            pass  # not on the CPU, or a conjugate view: the checks below say which
    if t.layout != torch.strided:  # a sparse tensor has no strides to speak of: say what it is
        raise InvalidArgument(f"{name}: torch tensor of layout {t.layout}; aioccl takes dense (torch.strided) "
                              f"tensors: pass {name}.to_dense()")
    if t.device.type != "cpu":
        raise InvalidArgument(f"{name}: torch tensor on device {t.device}; aioccl takes CPU and CUDA tensors")
    if not t.is_contiguous():
        raise InvalidArgument(f"{name}: torch tensor is not contiguous (strides {t.stride()}); pass "
                              f"{name}.contiguous() and copy the result back if you need it in place")
    try:
        if t.dtype == torch.bfloat16:
            return np.from_dlpack(t.view(torch.int16)).view(bfloat16())
        return np.from_dlpack(t)
    except (BufferError, TypeError, RuntimeError) as e:
        raise InvalidArgument(f"{name}: cannot view torch tensor of {t.dtype} through DLPack: {e}") from None


def wrapper(x: Any, arr: np.ndarray) -> Callable[[np.ndarray], Any]:
    """Results -> what the caller gets: the tensor itself when the result is all of its memory, a
    tensor over the slice otherwise (scatter's block of a full-size input)."""
    def wrap(a: np.ndarray) -> Any:
        return x if a is arr else new_tensor(a)

    return wrap


def new_tensor(arr: np.ndarray) -> Any:
    """A tensor sharing ``arr``'s memory: the fresh outputs of ops given torch inputs."""
    torch = sys.modules["torch"]
    if is_bfloat16(arr.dtype):
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)

