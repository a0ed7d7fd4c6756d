"""jax_ext's CUDA custom calls, the Python side: a site's GPU fallback, and what it teaches the handler.

The handler (``aioccl/native/src/py/xla_ffi_gpu.c``) launches a call it has learnt through the member
communicator's GPU lane on XLA's stream, without Python. Every other call comes here with XLA's stream and
the addresses and sizes of XLA's buffers: the op runs the engine's way on cupy views of those buffers, with
XLA's stream current (as the host callback's GPU side does, ``_gpu.py``). When that op was one launch of
the GPU lane, the handler learns it for these buffers and this stream, so the next such call is native. A
site of several members (a mesh-level op across processes: a communicator per mesh position) reads its
device's mesh position here (device memory) and teaches that member; the handler finds it again by the
stream (xla_ffi_gpu.c's ``learnt``).

Why a switch (``AIOCCL_JAX_GPU_NATIVE``, off by default): the handlers are tested against a stand-in
driver and synthetic call frames (tests/test_xla_ffi_gpu.py), not yet on a GPU under XLA;
``scripts/gpu-frameworks.sh`` runs jax_ext both ways on one. Off, a jax_ext op on a GPU lowers to XLA's
buffer callback, as before.
"""

from __future__ import annotations

import math
import os
from contextlib import nullcontext
from typing import Any

import numpy as np

from aioccl import lowlevel, native
from aioccl.lanes.cpu import CAPTURE

from . import _gpu, call_log
from .interrupts import run_guarded


def why_not() -> str | None:
    """None when jax_ext's ops on a GPU lower to the native CUDA custom call, else why not."""
    if os.environ.get("AIOCCL_JAX_GPU_NATIVE", "0").strip().lower() not in ("1", "true", "yes", "on"):
        return "AIOCCL_JAX_GPU_NATIVE is off (the default, until the CUDA handlers are measured on a GPU)"
    if native.core is None or not hasattr(native.core, "ffi_gpu_handlers"):
        return "the native core has no CUDA custom calls (built without XLA's FFI headers, or off)"
    return None


class _Device:
    """An XLA device buffer as cupy reads it (``__cuda_array_interface__``)."""

    def __init__(self, address: int, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.dtype = dtype
        self.__cuda_array_interface__ = {"shape": shape, "typestr": dtype.str if dtype != _gpu.BF16 else "<V2",
                                         "data": (address, False), "version": 3}


def _view(cp: Any, span: tuple[int, int], spec: tuple[np.dtype, tuple[int, ...]], what: str) -> Any:
    (address, nbytes), (dtype, shape) = span, spec
    want = math.prod(shape) * dtype.itemsize
    if nbytes != want:
        raise ValueError(f"{what}: XLA's buffer holds {nbytes} bytes, the op takes {want} ({dtype}{list(shape)})")
    return _gpu.view(cp, _Device(address, dtype, shape))


def fallback(site: Any, stream: int, where: int, ins: list[tuple[int, int]], outs: list[tuple[int, int]]) -> None:
    """The op of ``site`` on XLA's buffers (``(address, bytes)`` each) on XLA's ``stream``; learnt by the
    handler when it can launch it alone. An error's text becomes the XLA error (the exception is kept)."""
    from .native_call import report

    try:
        with _gpu.on_stream(stream) as (cp, s):
            read: list[int] = []  # the mesh position, where the site has several members (else never read)

            def position() -> int:
                read.append(_gpu.read_scalar_at(cp, s, where))
                return read[-1]

            comm = site.resolve(position)
            if lowlevel.on_engine_thread(comm):
                raise RuntimeError(f"{comm!r}: a jax_ext collective ran on its communicator's engine thread, "
                                   "where waiting would deadlock; create it with engine='thread'")
            if len(ins) != len(site.ins) or len(outs) != len(site.outs):
                raise ValueError(f"{site.what}: {len(ins)} inputs and {len(outs)} outputs, the op takes "
                                 f"{len(site.ins)} and {len(site.outs)}")
            arrays = [_view(cp, b, d, f"{site.what}: input {k}")
                      for k, (b, d) in enumerate(zip(ins, site.ins, strict=True))]
            results = [_view(cp, b, d, f"{site.what}: output {k}")
                       for k, (b, d) in enumerate(zip(outs, site.outs, strict=True))]
            same = bool(ins and outs and outs[0][1] and ins[0][0] == outs[0][0])
            learn = site.replayable(rank=comm.rank, same=same, **site.params)
            items = math.prod(site.ins[0][1]) if site.ins else 0
            logged = call_log.logged(comm.rank, site.what, items, "GPU") if call_log.get_logging() else nullcontext()
            with logged:
                if not learn:
                    run_guarded(site.run, comm, arrays, results, same, **site.params)
                    return
                with CAPTURE.learning() as ops:
                    run_guarded(site.run, comm, arrays, results, same, **site.params)
            _teach(site, read[0] if read else 0, ops, (ins[0] if ins else (0, 0)), (outs[0] if outs else (0, 0)),
                   stream)
    except BaseException as e:  # noqa: BLE001 - reported to XLA as its text, kept for error_cause
        raise RuntimeError(report(e)) from None


def _teach(site: Any, pos: int, ops: list[tuple[Any, ...]], inp: tuple[int, int], out: tuple[int, int],
           stream: int) -> None:
    """The member at mesh position ``pos`` launches this call itself from now on, when the op was the GPU
    lane's one launch."""
    if len(ops) != 1 or ops[0][0] != "gpu" or ops[0][1] is None:
        return
    _, lane, entry = ops[0]
    native.core.ffi_gpu_learn(site.index, pos, lane, (inp[0], out[0], inp[1], out[1], stream), entry)  # type: ignore[union-attr]
