"""The ib transport's protocol as pure state machines: chunking, credits, chunk order, reassembly.

No verbs and no loop: a simulated wire moves chunks between a SendWindow and a
RecvWindow + Reassembler, with completions delivered in random orders, and
every byte of every frame is checked.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioccl.transport.frames import COLL, HEADER_SIZE, Header
from aioccl.transport.ib.protocol import (
    MASK32,
    ProtocolError,
    Reassembler,
    RecvWindow,
    SendWindow,
    chunk_plan,
    recv_depth,
    split_wr_id,
    wr_id,
)


def test_chunk_plan_covers_the_payload_once_and_fills_slots():
    slot = 4096
    for n in (0, 1, slot - HEADER_SIZE, slot - HEADER_SIZE + 1, 5 * slot, 5 * slot + 17):
        plan = chunk_plan(n, slot)
        assert plan[0][0] == 0 and plan[0][1] == min(n, slot - HEADER_SIZE)
        assert all(k == slot for _o, k in plan[1:-1])
        covered = [o + i for o, k in plan for i in range(0, k, 511)]
        assert sum(k for _o, k in plan) == n and covered == sorted(covered)
        assert all(plan[i][0] + plan[i][1] == plan[i + 1][0] for i in range(len(plan) - 1))


def test_wr_id_round_trips():
    for conn, kind, idx in [(1, 1, 0), (4095, 3, 0xFFFFF), (77, 2, 12345)]:
        assert split_wr_id(wr_id(conn, kind, idx)) == (conn, kind, idx)


def test_credits_bound_the_writes_and_staging_slots_wait_for_their_completion():
    tx = SendWindow(4)
    slots = [tx.take() for _ in range(4)]
    assert [s for s, _ in slots] == [0, 1, 2, 3] and [i for _, i in slots] == [0, 1, 2, 3]
    assert not tx.ready()  # no credit
    tx.on_credit(2)
    assert not tx.ready()  # credit, but staging slot 0's write has not completed
    tx.on_write_done(0)
    assert tx.ready() and tx.take() == (0, 4)
    tx.on_credit(1)  # a stale (smaller) cumulative count changes nothing
    assert tx.freed == 2
    with pytest.raises(ProtocolError):
        tx.on_credit(99)
    with pytest.raises(ProtocolError):
        tx.on_write_done(3) or tx.on_write_done(3)


def test_receiver_hands_chunks_on_in_order_and_returns_credits():
    rx = RecvWindow(4)
    assert rx.on_write(1, 10) == []  # early: held back
    assert rx.on_write(2, 20) == []
    assert rx.on_write(0, 5) == [(0, 5), (1, 10), (2, 20)]
    assert rx.credit_due() is None
    rx.release(3)
    assert rx.credit_due() == 3 and rx.credit_due() is None
    with pytest.raises(ProtocolError, match="not expected"):
        rx.on_write(1, 1)  # a duplicate
    with pytest.raises(ProtocolError, match="not expected"):
        rx.on_write(3 + 4, 1)  # beyond the FIFO
    assert rx.on_write(3, 1) == [(3, 1)]


def test_receiver_detects_a_sender_that_ignores_credits():
    rx = RecvWindow(2)
    assert rx.on_write(0, 1) == [(0, 1)]
    assert rx.on_write(1, 1) == [(1, 1)]
    with pytest.raises(ProtocolError, match="overran"):
        rx.on_write(2, 1)  # slots 0 and 1 are not freed yet


def test_chunk_numbers_wrap_at_32_bits():
    tx, rx = SendWindow(4), RecvWindow(4)
    tx.sent = tx.freed = rx.next = rx.freed = rx.reported = MASK32 - 1
    for _ in range(4):
        slot, imm = tx.take()
        assert rx.on_write(imm, 1) == [(slot, 1)]
        rx.release()
        tx.on_write_done(slot)
        tx.on_credit(rx.credit_due() or 0)
    assert tx.sent == MASK32 + 3 and tx.take()[1] == 2


def _frame(i: int, n: int) -> tuple[bytes, bytes]:
    h = Header(COLL, 1, 2, i, 7, i, n, n, 0, 0).pack()
    return h, (np.arange(n, dtype=np.uint32) * 2654435761 + i).astype(np.uint8).tobytes()


def _run(sizes: list[int], slot: int, nslots: int, seed: int) -> None:
    """Frames through the windows with completions in random order; every byte checked."""
    rng = random.Random(seed)
    tx, rx = SendWindow(nslots), RecvWindow(nslots)
    fifo = bytearray(nslots * slot)
    got: list[tuple[Header, bytes]] = []
    targets: dict[int, bytearray] = {}

    def on_header(h: Header):
        buf = bytearray(h.nbytes)
        targets[h.k] = buf
        return memoryview(buf), lambda: got.append((h, bytes(buf)))

    reasm = Reassembler(on_header)
    chunks = []
    for i, n in enumerate(sizes):
        h, p = _frame(i, n)
        for j, (off, k) in enumerate(chunk_plan(n, slot)):
            chunks.append((h if j == 0 else b"") + p[off:off + k])
    in_flight: list[tuple[int, int, bytes]] = []  # (slot, imm, bytes) written, completion not yet seen
    pending_done: list[int] = []
    credits: list[int] = []
    while chunks or in_flight or pending_done or credits:
        moves = []
        if chunks and tx.ready():
            moves.append("send")
        if in_flight:
            moves.append("land")
        if pending_done:
            moves.append("done")
        if credits:
            moves.append("credit")
        move = rng.choice(moves)
        if move == "send":
            slot_i, imm = tx.take()
            data = chunks.pop(0)
            fifo[slot_i * slot:slot_i * slot + len(data)] = data  # the RDMA write places the bytes
            in_flight.append((slot_i, imm, data))
            pending_done.append(slot_i)
        elif move == "land":
            slot_i, imm, data = in_flight.pop(rng.randrange(len(in_flight)))  # reordered completion
            for s, nbytes in rx.on_write(imm, len(data)):
                reasm.feed(memoryview(fifo)[s * slot:s * slot + nbytes])
                rx.release()
            credit = rx.credit_due()
            if credit is not None:
                credits.append(credit)
        elif move == "credit":  # credit messages arrive late, out of order, or superseded
            tx.on_credit(credits.pop(rng.randrange(len(credits))))
        else:
            tx.on_write_done(pending_done.pop(rng.randrange(len(pending_done))))
    assert [h.k for h, _ in got] == list(range(len(sizes)))
    for (h, payload), n in zip(got, sizes, strict=False):
        assert payload == _frame(h.k, n)[1]
    assert not reasm.mid_frame() and tx.idle()


@pytest.mark.parametrize("seed", range(6))
def test_frames_survive_reordered_completions(seed):
    _run([0, 1, 4000, 4048, 4049, 20000, 3, 65536], slot=4096, nslots=3, seed=seed)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 30000), min_size=1, max_size=12), st.integers(1, 5), st.integers(0, 10**6))
def test_any_frame_sizes_and_orders(sizes, nslots, seed):
    _run(sizes, slot=1024, nslots=max(2, nslots), seed=seed)


def test_reassembler_rejects_garbage():
    r = Reassembler(lambda h: (memoryview(bytearray(h.nbytes)), lambda: None))
    with pytest.raises(ProtocolError, match="less than a header"):
        r.feed(memoryview(b"\x01" * 10))
    with pytest.raises(ProtocolError):
        r.feed(memoryview(bytes(HEADER_SIZE)))  # kind 0 is no frame kind
    h = Header(COLL, 1, 2, 0, 7, 0, 4).pack()
    with pytest.raises(ProtocolError, match="overruns"):
        r.feed(memoryview(h + b"12345"))


def test_recv_depth_covers_writes_and_credit_messages():
    assert recv_depth(8) >= 8 + 8
