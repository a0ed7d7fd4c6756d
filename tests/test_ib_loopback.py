"""The ib transport end to end on the loopback verbs backend: a test of its protocol, not of a NIC.

Communicators in this process connect their ranks with RC queue pairs of the
in-process loopback backend (``AIOCCL_NET=ib AIOCCL_IB_BACKEND=loopback``):
chunking, credits, immediates, completion events, registration and errors
all run for real; only the NIC is played by a thread that copies bytes.
Fault injection covers delayed and reordered completions, a remote access
error, and receivers that are not ready. The same code over a real NIC runs
in test_ib_verbs.py (``rdma`` marker) and scripts/rdma-check.sh.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

import numpy as np
import pytest

import aioccl
from aioccl.transport.ib import loopback
from aioccl.transport.ib.verbs import WC_RECV_IMM, WC_WRITE, Piece

from conftest import WORKERS, close_all, make_comms

sys.path.insert(0, str(WORKERS))
import collectives as matrix_worker  # noqa: E402

from _check import DTYPES, Checker  # noqa: E402


@pytest.fixture
def fabric():
    fab = loopback.fabric()
    fab.reset()
    yield fab
    fab.reset()


@pytest.fixture
def small_slots(monkeypatch):
    """Tiny slots and only two of them: every op runs in many chunks and waits for credits."""
    monkeypatch.setenv("AIOCCL_IB_BUFFSIZE", "4096")
    monkeypatch.setenv("AIOCCL_IB_SLOTS", "2")


# -- the loopback backend behaves like verbs ---------------------------------------------------------
def _pair(fab: loopback.Fabric, depth: int = 8):
    a, b = fab.open(), fab.open()
    qa, qb = a.create_qp(depth), b.create_qp(depth)
    qa.connect(qb.endpoint())
    qb.connect(qa.endpoint())
    return a, b, qa, qb


def _wait(dev, n: int = 1, timeout: float = 5.0):
    import select
    got = []
    dev.arm()
    while len(got) < n:
        got += dev.poll(16)
        if len(got) < n:
            assert select.select([dev.fileno()], [], [], timeout)[0], "no completion event"
            dev.arm()
    return got


def test_loopback_checks_keys_and_bounds_like_a_nic(fabric):
    a, b, qa, qb = _pair(fabric)
    src, dst = np.arange(64, dtype=np.uint8), np.zeros(64, np.uint8)
    rs, rd = a.register(src.ctypes.data, 64), b.register(dst.ctypes.data, 64)
    qb.post_recv(7, [])
    qa.post_write_imm(1, [Piece(rs, 8, 16)], rd.addr + 4, rd.rkey, 0xABCD)
    (wc,) = _wait(a)
    assert (wc.wr_id, wc.opcode, wc.error) == (1, WC_WRITE, None)
    (rc,) = _wait(b)
    assert (rc.wr_id, rc.opcode, rc.imm, rc.byte_len) == (7, WC_RECV_IMM, 0xABCD, 16)
    assert dst[4:20].tolist() == list(range(8, 24)) and not dst[:4].any() and not dst[20:].any()
    qb.post_recv(8, [])
    qa.post_write_imm(2, [Piece(rs, 0, 16)], rd.addr + 60, rd.rkey, 1)  # runs past the region
    (wc,) = _wait(a)
    assert wc.error == "remote access error"
    qa.post_write_imm(3, [Piece(rs, 0, 1)], rd.addr, rd.rkey, 1)  # the QP is in error now
    assert _wait(a)[0].error.startswith("work request flushed")
    with pytest.raises(loopback.LoopbackError, match="local protection"):
        qa.post_send(4, [Piece(rs, 60, 8)])
    for d in (a, b):
        d.close()


def test_receiver_not_ready_is_retried_then_reported(fabric):
    fabric.reset(loopback.Faults(recv_delay_s=0.02))
    a, b, qa, qb = _pair(fabric)
    buf = np.zeros(8, np.uint8)
    ra, rb = a.register(buf.ctypes.data, 8), b.register(buf.ctypes.data, 8)
    qb.post_recv(1, [Piece(rb, 0, 8)])
    qa.post_send(2, [Piece(ra, 0, 8)])
    assert _wait(a)[0].error is None  # retried until the receive became usable
    fabric.reset(loopback.Faults(rnr_retry=3))
    qa.post_send(3, [Piece(ra, 0, 8)])  # no receive posted at all
    assert "RNR retry" in _wait(a)[0].error
    for d in (a, b):
        d.close()


# -- whole communicators over ib ---------------------------------------------------------------------
async def _matrix(comms: list[aioccl.Communicator], dtypes: list[type], sizes: list[int]) -> None:
    cks = [Checker(c.rank) for c in comms]
    await asyncio.gather(*(matrix_worker.registered(c, ck) for c, ck in zip(comms, cks, strict=False)))
    await asyncio.gather(*(matrix_worker.matrix(c, ck, dtypes, sizes) for c, ck in zip(comms, cks, strict=False)))
    failures = [f for ck in cks for f in ck.failures]
    assert not failures, failures[:10]
    assert all(ck.count > 300 for ck in cks), [ck.count for ck in cks]


async def test_every_op_and_dtype_in_many_chunks(fabric, small_slots):
    comms = await make_comms(3, transport="ib")
    try:
        assert [c.transport for c in comms] == ["ib"] * 3 and comms[0].transport_to(1) == "ib"
        await _matrix(comms, DTYPES, [0, 1, 37, 3000])
    finally:
        await close_all(comms)


async def test_delayed_and_reordered_completions(fabric, small_slots):
    fabric.reset(loopback.Faults(delay_s=0.0005, reorder=True, seed=5))
    comms = await make_comms(3, transport="ib", engine="thread")
    try:
        await _matrix(comms, [np.int32, np.float64], [1, 5000])
    finally:
        await close_all(comms)


async def test_zero_copy_sends_from_registered_arrays(fabric):
    comms = await make_comms(2, transport="ib")
    try:
        n = 1 << 20
        xs = [c.alloc(n, np.int32) for c in comms]
        port = comms[0]._engine.ib_port
        assert port is not None and port.find(xs[0].ctypes.data, xs[0].nbytes) is not None
        for r, x in enumerate(xs):
            x[:] = np.arange(n) % 1000 + r
        outs = await asyncio.gather(*(c.all_gather(x) for c, x in zip(comms, xs, strict=False)))
        want = np.concatenate([np.arange(n) % 1000 + r for r in range(2)]).astype(np.int32)
        for o in outs:
            np.testing.assert_array_equal(o, want)
        got = np.full(n, -1, np.int32)
        await asyncio.gather(comms[0].send(xs[0], 1, tag=3), comms[1].recv(got, 0, tag=3))
        np.testing.assert_array_equal(got, xs[0])
        region = port.find(xs[0].ctypes.data, 4)
        del xs, outs
        import gc
        gc.collect()
        assert port.find(region.addr, 4) is None  # deregistered with the array
    finally:
        await close_all(comms)


async def test_remote_access_error_fails_the_op_on_every_rank_with_the_status(fabric):
    comms = await make_comms(3, transport="ib")
    try:
        fabric.reset(loopback.Faults(access_error_at=2))
        ws = [c.all_reduce(np.full(50_000, r, np.int64), timeout=2) for r, c in enumerate(comms)]
        errors = []
        for w in ws:
            with pytest.raises(aioccl.AiocclError) as ei:
                await w
            errors.append(ei.value)
        # the writer names the verbs status; its peer hears of it at once through the side channel
        # (not at its deadline); a rank not on the broken link times out naming whom it waited for
        lost = [e for e in errors if isinstance(e, aioccl.PeerLost)]
        assert any("remote access error" in str(e) for e in lost), errors
        assert len(lost) >= 2, errors
        assert all(isinstance(e, (aioccl.PeerLost, aioccl.CollectiveTimeout)) for e in errors), errors
    finally:
        fabric.reset()
        for c in comms:
            c.abort()


async def test_receivers_not_ready_only_slow_things_down(fabric):
    fabric.reset(loopback.Faults(recv_delay_s=0.003))
    comms = await make_comms(2, transport="ib")
    try:
        outs = await asyncio.gather(*(c.all_reduce(np.full(3000, r + 1, np.int32)) for r, c in enumerate(comms)))
        for o in outs:
            assert (o == 3).all()
    finally:
        await close_all(comms)


async def test_a_silent_rank_is_named_and_graceful_close_is_quiet(fabric, caplog):
    comms = await make_comms(3, transport="ib")
    w = [c.all_reduce(np.ones(4, np.float32), timeout=0.5) for c in comms[:2]]
    named = []
    for x in w:
        with pytest.raises(aioccl.CollectiveTimeout) as ei:
            await x
        named.append(ei.value.waiting_for)
    assert [2] in named and all(named), named  # rank 1 waits on rank 2; rank 0 on whoever it needs next
    for c in comms:
        c.abort()
    comms = await make_comms(2, transport="ib")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="aioccl"):
        await asyncio.gather(*(c.all_reduce(np.ones(4, np.float32)) for c in comms))
        await close_all(comms)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.records


async def test_forcing_ib_without_a_device_names_the_reason(monkeypatch):
    monkeypatch.setenv("AIOCCL_IB_BACKEND", "pyverbs")
    monkeypatch.setenv("AIOCCL_IB_DISABLE", "1")
    monkeypatch.setenv("AIOCCL_NET", "ib")
    uid = aioccl.UniqueId.new(host="127.0.0.1")
    res = await asyncio.gather(*(aioccl.Communicator.create(uid, r, 2, timeout=10) for r in range(2)),
                               return_exceptions=True)
    assert all(isinstance(e, aioccl.BootstrapError) for e in res), res
    assert "disabled by AIOCCL_IB_DISABLE=1" in str(res[0])


def test_env_of_this_module_is_clean():
    assert os.environ.get("AIOCCL_NET") is None
