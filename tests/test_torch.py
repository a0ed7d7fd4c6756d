"""torch CPU tensors in every op (DLPack, in place), across real processes, and the adapter's edge cases."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import aioccl

from conftest import TRANSPORT_ENV, close_all, launch, make_comms

torch = pytest.importorskip("torch", reason="torch is not installed (make test installs the CPU build)")


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_every_op_on_tensors_across_processes(transport):
    p = launch(3, "torch_ops.py", env=TRANSPORT_ENV[transport])
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for r in range(3):
        assert f"[rank {r}] torch n=3 transport={transport}: 834 checks, 0 failures" in p.stdout, p.stdout[-2000:]


def test_bfloat16_travels_as_its_bits():
    from aioccl.buffers import adapt

    x = torch.tensor([1.5, -2.0, 3.0e38], dtype=torch.bfloat16)
    buf = adapt(x, "x")
    assert buf.array.dtype.name == "bfloat16" and buf.writable
    assert buf.array.view(np.int16).tolist() == x.view(torch.int16).tolist()
    buf.array[0] = 7
    assert x[0].item() == 7.0  # the same memory


@pytest.mark.parametrize("make, message", [
    (lambda: torch.zeros(4, 4)[:, 1], "not contiguous (strides (4,)); pass x.contiguous()"),
    (lambda: torch.zeros(3, dtype=torch.bool), "unsupported dtype bool"),
    (lambda: torch.zeros(3, dtype=torch.complex64), "unsupported dtype complex64"),
    (lambda: torch.zeros(3, device="meta"), "torch tensor on device meta"),
])
async def test_bad_tensors_are_refused_before_anything_is_sent(make, message):
    comms = await make_comms(2)
    try:
        for c in comms:
            with pytest.raises(aioccl.InvalidArgument, match=message.replace("(", r"\(").replace(")", r"\)")):
                c.all_reduce(make())
        xs = [torch.full((5,), float(c.rank + 1)) for c in comms]
        ys = await _gather(c.all_reduce(x) for c, x in zip(comms, xs, strict=True))
        for x, y in zip(xs, ys, strict=True):
            assert y is x and x.tolist() == [3.0] * 5  # still usable
    finally:
        await close_all(comms)


async def test_fresh_outputs_are_tensors_sharing_memory_with_nothing_of_the_caller():
    comms = await make_comms(2)
    try:
        xs = [torch.arange(3, dtype=torch.int32) + 10 * c.rank for c in comms]
        outs = await _gather(c.all_gather(x) for c, x in zip(comms, xs, strict=True))
        for x, g in zip(xs, outs, strict=True):
            assert isinstance(g, torch.Tensor) and g.dtype == torch.int32
            assert g.tolist() == [0, 1, 2, 10, 11, 12] and g.data_ptr() != x.data_ptr()
    finally:
        await close_all(comms)


async def _gather(works):
    return await asyncio.gather(*works)
