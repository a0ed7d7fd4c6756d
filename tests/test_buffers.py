"""Inputs beyond numpy: JAX arrays (immutable -> new arrays), DLPack objects, the buffer protocol."""

from __future__ import annotations

import array
import asyncio

import numpy as np
import pytest
import pytest_asyncio

import aioccl

from conftest import close_all, make_comms

jnp = pytest.importorskip("jax.numpy", reason="jax is not installed (pip install -e '.[test]')")


class DLPackOnly:
    """Exposes memory only through DLPack, as torch CPU tensors do."""

    def __init__(self, arr: np.ndarray) -> None:
        self._arr = arr

    def __dlpack__(self, **kw):
        return self._arr.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._arr.__dlpack_device__()


class FakeDevice(DLPackOnly):
    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA


class OtherDevice(DLPackOnly):
    def __dlpack_device__(self):
        return (4, 0)  # kDLOpenCL


@pytest_asyncio.fixture
async def pair():
    comms = await make_comms(2)
    yield comms
    await close_all(comms)


async def test_jax_arrays_give_new_arrays_and_stay_untouched(pair):
    xs = [jnp.arange(6, dtype=jnp.float32) + c.rank for c in pair]
    ys = await asyncio.gather(*(c.all_reduce(x) for c, x in zip(pair, xs, strict=True)))
    for c, x, y in zip(pair, xs, ys, strict=True):
        assert type(y).__module__.startswith("jax")
        assert np.array_equal(np.asarray(y), 2 * np.arange(6) + 1)
        assert np.array_equal(np.asarray(x), np.arange(6) + c.rank)
    bs = await asyncio.gather(*(c.broadcast(jnp.full(3, c.rank, jnp.int32), root=1) for c in pair))
    assert all(np.array_equal(np.asarray(b), [1, 1, 1]) for b in bs)
    gs = await asyncio.gather(*(c.all_gather(jnp.array([c.rank], jnp.bfloat16)) for c in pair))
    assert all(np.array_equal(np.asarray(g, np.float32), [0, 1]) for g in gs)
    ss = await asyncio.gather(*(c.reduce_scatter(jnp.arange(4, dtype=jnp.int32)) for c in pair))
    assert [np.asarray(s).tolist() for s in ss] == [[0, 2], [4, 6]]
    a2a = await asyncio.gather(*(c.all_to_all(jnp.array([10 * c.rank, 10 * c.rank + 1])) for c in pair))
    assert [np.asarray(a).tolist() for a in a2a] == [[0, 10], [1, 11]]
    with pytest.raises(aioccl.InvalidArgument, match="read-only"):
        pair[0].irecv(jnp.zeros(2), 1)


async def test_dlpack_objects_are_written_in_place(pair):
    raws = [np.full(5, c.rank + 1, np.int64) for c in pair]
    objs = [DLPackOnly(r) for r in raws]
    got = await asyncio.gather(*(c.all_reduce(o) for c, o in zip(pair, objs, strict=True)))
    assert got[0] is objs[0] and got[1] is objs[1]
    assert all((r == 3).all() for r in raws)
    with pytest.raises(aioccl.InvalidArgument, match=r"FakeDevice, in GPU memory"):  # no GPU, or not viewable
        pair[0].all_reduce(FakeDevice(np.zeros(2)))
    with pytest.raises(aioccl.InvalidArgument, match=r"DLPack device \(4, 0\), which is neither the CPU nor a CUDA"):
        pair[0].all_reduce(OtherDevice(np.zeros(2)))


async def test_buffer_protocol_objects(pair):
    bufs = [array.array("i", [c.rank] * 4) for c in pair]
    got = await asyncio.gather(*(c.all_reduce(b, op="max") for c, b in zip(pair, bufs, strict=True)))
    assert got[0] is bufs[0] and list(bufs[0]) == [1] * 4 and list(bufs[1]) == [1] * 4
    with pytest.raises(aioccl.InvalidArgument, match="read-only"):
        pair[0].all_reduce(b"abcd")
