"""The point-to-point lane (``PairLane``, native/src/py/pair_lane.c; owner lanes/pair.py): isend and irecv of a
numpy array over a same-host pair's FIFO, from the call to the done Work in C.

Two communicators in this process over real shared-memory pairs: what the lane takes is exact for every
dtype and size up to the eager limit; what it must not take (something posted, held or queued before it,
a wildcard, another message first, a mismatch, input it does not check) goes the general way, so MPI's
order and every error stay as the engine gives them. Across processes: tests/workers/pair_lane.py. From
other threads than the engine's, and the single copy: tests/test_pair_lane_threads.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import aioccl
from aioccl import ANY_SOURCE, Status, native
from aioccl.dtypes import SUPPORTED_DTYPES, dtype_code
from aioccl.errors import CollectiveMismatch, InvalidArgument
from aioccl.transport.frames import P2P
from aioccl.transport.frames import pack as pack_header
from aioccl.transport.shm.fifo import QUIET, WATCHING

from conftest import close_all, launch, make_comms

pytestmark = pytest.mark.skipif(native.core is None, reason=f"the native core is not loaded: {native.status()}")


def pair(body: Callable[[aioccl.Communicator, aioccl.Communicator], Coroutine[Any, Any, None]]) -> None:
    async def main() -> None:
        a, b = await make_comms(2)
        try:
            assert a._pair.native is not None and b._pair.native is not None
            await body(a, b)
        finally:
            await close_all([a, b])

    asyncio.run(main())


def data(n: int, dt: Any, k: int = 0) -> np.ndarray:
    return ((np.arange(n) + k) % 97).astype(dt)


def poisoned(n: int, dt: Any) -> np.ndarray:
    return np.full(n, 113, dt)


def counts(c: aioccl.Communicator) -> tuple[int, int]:
    s = c._pair.native.stats()
    return s["sent"], s["received"]


@pytest.mark.parametrize("dt", [*SUPPORTED_DTYPES, np.dtype(ml_dtypes.bfloat16)], ids=str)
def test_every_dtype_and_size_done_in_the_call_and_exact(dt: Any) -> None:
    async def body(a: aioccl.Communicator, b: aioccl.Communicator) -> None:
        for k, n in enumerate((0, 1, 7, 1000, (80 << 10) // np.dtype(dt).itemsize + 3)):  # (the last: GIL released)
            x, y = data(n, dt, k), poisoned(n, dt)
            before = counts(a)[0], counts(b)[1]
            w = a.isend(x, 1, tag=100 + k)
            r = b.irecv(y, 0, tag=100 + k)
            assert w.done() and r.done(), (n, w, r)  # born done in C: no loop turn needed
            assert (counts(a)[0], counts(b)[1]) == (before[0] + 1, before[1] + 1)
            assert await w is None and (await r) is y
            assert r.status == Status(0, 100 + k) and w.op == f"send(peer=1, tag={100 + k})"
            assert r.op == f"recv(peer=0, tag={100 + k})"
            assert np.array_equal(y.view(np.uint8), x.view(np.uint8)), (n, y[:8], x[:8])
        assert any("send(peer=1, tag=104)" in line for line in a.recent()), a.recent()
        assert any("recv(peer=0, tag=104)" in line for line in b.recent()), b.recent()

    pair(body)


def test_cpu_tensors_go_through_the_lane_and_come_back_as_themselves() -> None:
    torch = pytest.importorskip("torch")

    async def body(a: aioccl.Communicator, b: aioccl.Communicator) -> None:
        for dt in (torch.int32, torch.float64, torch.uint8):
            x, y = torch.arange(11).to(dt), torch.full((11,), 113).to(dt)
            before = counts(a)[0], counts(b)[1]
            w, r = a.isend(x, 1, 2), b.irecv(y, 0, 2)
            assert w.done() and r.done() and (counts(a)[0], counts(b)[1]) == (before[0] + 1, before[1] + 1)
            got = await r
            assert got is y and torch.equal(y, x), (dt, y)
        g, out = torch.arange(3.0, requires_grad=True), np.zeros(3, np.float32)  # no numpy view: the general way
        sent = counts(a)[0]
        await asyncio.gather(a.isend(g, 1, 2), b.irecv(out, 0, 2))
        assert counts(a)[0] == sent and (out == [0.0, 1.0, 2.0]).all()

    pair(body)


def test_a_receive_posted_first_takes_the_first_message() -> None:
    """The lane never takes a message that an earlier receive, posted in the engine, is owed (same key)."""
    async def body(a: aioccl.Communicator, b: aioccl.Communicator) -> None:
        y1, y2 = poisoned(4, np.int32), poisoned(4, np.int32)
        r1 = b.irecv(y1, 0, 5)  # nothing there: the engine posts it
        assert not r1.done()
        s1, s2 = a.isend(data(4, np.int32, 1), 1, 5), a.isend(data(4, np.int32, 2), 1, 5)
        taken = counts(b)[1]
        r2 = b.irecv(y2, 0, 5)
        assert counts(b)[1] == taken  # the lane stood aside
        await asyncio.gather(s1, s2, r1, r2)
        assert (y1 == data(4, np.int32, 1)).all() and (y2 == data(4, np.int32, 2)).all(), (y1, y2)

    pair(body)


def test_a_wildcard_posted_first_takes_the_first_message() -> None:
    async def body(a: aioccl.Communicator, b: aioccl.Communicator) -> None:
        yw, y = poisoned(3, np.float64), poisoned(3, np.float64)
        rw = b.irecv(yw, ANY_SOURCE, 7)
        await asyncio.gather(a.isend(data(3, np.float64, 1), 1, 7), a.isend(data(3, np.float64, 2), 1, 7))
        r = b.irecv(y, 0, 7)
        await asyncio.gather(rw, r)
        assert (yw == data(3, np.float64, 1)).all() and (y == data(3, np.float64, 2)).all(), (yw, y)
        assert rw.status == Status(0, 7)

    pair(body)


def test_a_message_held_before_comes_first_and_both_are_the_lanes() -> None:
    """A message the engine read in before its receive (held in the mailbox: a receive posted in the engine
    wanted one behind it) is taken from there; one left in the FIFO, from the FIFO; in order."""
    async def body(a: aioccl.Communicator, b: aioccl.Communicator) -> None:
        box, conn = b._engine.mailbox, b._engine.conns[0]
        await a.isend(data(5, np.int64, 1), 1, 4)
        await a.isend(data(5, np.int64, 3), 1, 8)
        await settle(b)
        assert conn.reader.lingered and not box.p2p_early  # both left in the FIFO
        y3 = poisoned(5, np.int64)
        await b.irecv(y3, 0, 8, timeout=5)  # the engine's receive reads both in: tag 4's is held
        assert [key[2] for key in box.p2p_early] == [4]
        await a.isend(data(5, np.int64, 2), 1, 4)
        await settle(b)
        y1, y2 = poisoned(5, np.int64), poisoned(5, np.int64)
        taken = counts(b)[1]
        await b.irecv(y1, 0, 4)
        await b.irecv(y2, 0, 4)  # the last, still in the FIFO
        assert (y1 == data(5, np.int64, 1)).all() and (y2 == data(5, np.int64, 2)).all(), (y1, y2)
        assert (y3 == data(5, np.int64, 3)).all()
        assert counts(b)[1] == taken + 2
        assert not box.p2p_early and box.budget.held.get(0, 0) == 0

    pair(body)


def test_a_run_of_messages_waits_in_the_fifo_and_the_lane_takes_them_in_order() -> None:
    async def body(a: aioccl.Communicator, b: aioccl.Communicator) -> None:
        box, conn = b._engine.mailbox, b._engine.conns[0]
        for k in range(20):
            await a.isend(data(3, np.uint32, k), 1, k % 2)
        await settle(b)
        assert conn.reader.lingered and not box.p2p_early
        taken = counts(b)[1]
        for k in (0, 2, 4):  # tag 0 first: each is at the FIFO's head in turn... until a tag 1 is
            y = poisoned(3, np.uint32)
            await b.irecv(y, 0, 0)
            assert (y == data(3, np.uint32, k)).all(), (k, y)
        for k in range(1, 20, 2):
            y = poisoned(3, np.uint32)
            await b.irecv(y, 0, 1)
            assert (y == data(3, np.uint32, k)).all(), (k, y)
        for k in range(6, 20, 2):
            y = poisoned(3, np.uint32)
            await b.irecv(y, 0, 0)
            assert (y == data(3, np.uint32, k)).all(), (k, y)
        assert counts(b)[1] >= taken + 18 and not box.p2p_early

    pair(body)


async def settle(c: aioccl.Communicator) -> None:
    """Let the engine hear the bell and read its FIFOs."""
    for _ in range(5):
        await asyncio.sleep(0.002)


def test_the_last_message_waits_in_the_fifo_until_something_posted_wants_it() -> None:
    """Left in the FIFO for the lane, a message is still found by every other way in: a receive with a
    deadline (the engine's), a wildcard, a probe, and a receive after its sender closed."""
    async def body(a: aioccl.Communicator, b: aioccl.Communicator) -> None:
        box, conn = b._engine.mailbox, b._engine.conns[0]
        for tag, receive in ((6, lambda y: b.irecv(y, 0, 6, timeout=5)), (7, lambda y: b.irecv(y, ANY_SOURCE, 7)),
                             (9, lambda y: b.irecv(y, 0, aioccl.ANY_TAG))):
            await a.isend(data(3, np.int32, tag), 1, tag)
            await settle(b)
            assert conn.reader.lingered and not box.p2p_early  # left in the FIFO
            y = poisoned(3, np.int32)
            await receive(y)
            assert (y == data(3, np.int32, tag)).all(), (tag, y)
        await a.isend(data(4, np.float32, 1), 1, 10)
        await settle(b)
        assert conn.reader.lingered
        m = await b.probe(0, 10)
        assert (m.source, m.tag, m.size) == (0, 10, 4)
        y = poisoned(4, np.float32)
        await b.irecv(y, m.source, m.tag)
        assert (y == data(4, np.float32, 1)).all()
        await a.isend(data(2, np.uint8, 5), 1, 12)
        await settle(b)
        assert conn.reader.lingered
        await a.close()
        await settle(b)
        y8 = poisoned(2, np.uint8)
        await b.irecv(y8, 0, 12)  # read in before the connection ended: the message stays good
        assert (y8 == data(2, np.uint8, 5)).all()

    pair(body)


def test_a_quiet_fifo_rings_no_bell_and_every_other_way_in_still_finds_the_message() -> None:
    """Once the receiver's lane saw nothing posted, its FIFO is *quiet*: the sender's lane rings no bell for a
    message, so the engine never hears of it; a receive, wildcard or probe posted later makes the FIFO loud
    again and reads it (fence between: the message is found whichever side went first), as does the end of
    the connection."""
    async def body(a: aioccl.Communicator, b: aioccl.Communicator) -> None:
        conn = b._engine.conns[0]

        async def quiet_send(k: int, tag: int, dt: Any = np.int32) -> None:
            await a.isend(data(1, np.int8), 1, 99)  # a round trip through both lanes: b's FIFO from a is quiet
            y1 = poisoned(1, np.int8)
            await b.irecv(y1, 0, 99)
            await settle(b)  # (the bell that message rang)
            assert conn.rx.ctl[QUIET] == 1
            before, scanned = conn.rx.available(), conn.reader._scanned
            await a.isend(data(k, dt, tag), 1, tag)
            await settle(b)
            assert conn.rx.available() > before and conn.reader._scanned == scanned  # never read: no bell rang

        ways = ((6, lambda y: b.irecv(y, 0, 6, timeout=5)), (7, lambda y: b.irecv(y, ANY_SOURCE, 7)),
                (9, lambda y: b.irecv(y, 0, aioccl.ANY_TAG)))
        for tag, receive in ways:
            await quiet_send(3, tag)
            y = poisoned(3, np.int32)
            await asyncio.wait_for(receive(y), 10)
            assert (y == data(3, np.int32, tag)).all(), (tag, y)
            assert conn.rx.ctl[QUIET] == 0
        await quiet_send(4, 10, np.float32)
        m = await asyncio.wait_for(b.probe(0, 10), 10)
        assert (m.source, m.tag, m.size) == (0, 10, 4)
        y = poisoned(4, np.float32)
        await b.irecv(y, m.source, m.tag)
        assert (y == data(4, np.float32, 10)).all()
        await quiet_send(2, 12, np.uint8)
        await a.close()
        await settle(b)
        y8 = poisoned(2, np.uint8)
        await asyncio.wait_for(b.irecv(y8, 0, 12), 10)  # read in as the connection ended
        assert (y8 == data(2, np.uint8, 12)).all()

    pair(body)


def test_a_frame_the_engine_began_reading_in_a_quiet_fifo_makes_it_loud_so_its_end_rings() -> None:
    """The FIFO is quiet (the receiver's lane saw nothing posted: the sender's lane rings no bell), and the engine,
    woken for something else, begins a message whose sender is still writing it. The engine reads the rest only
    on a bell, so the FIFO must be loud again by then: the sender's lane, ending the frame, sees it and rings.
    Left quiet, the rest came without a bell and the receive waited forever (a ppermute of 512 KiB hung in 1 run
    of 10 under make stress, issue 75). The sender's lane is played here by hand: half the frame, the engine's
    read, the other half, and the bell exactly when the lane's rule (not watching, not quiet) says."""
    async def body(a: aioccl.Communicator, b: aioccl.Communicator) -> None:
        conn, tx = b._engine.conns[0], a._engine.conns[1].tx
        await a.isend(data(1, np.int8), 1, 99)  # a round trip through both lanes: b's FIFO from a is quiet
        y1 = poisoned(1, np.int8)
        await b.irecv(y1, 0, 99)
        await settle(b)
        assert conn.rx.ctl[QUIET] == 1
        n, tag = 4096, 21
        payload = data(n, np.int32, tag).tobytes()
        header = pack_header(P2P, 0, dtype_code(np.dtype(np.int32)), 0, a._state.view.ctx, tag, len(payload))
        assert tx.write(memoryview(header + payload[:n])) == len(header) + n  # the header and a quarter
        conn.pump()  # the engine, woken by another bell
        assert conn.reader.mid_frame()
        assert conn.rx.ctl[QUIET] == 0, "the engine waits for the rest of a frame in a FIFO left quiet"
        assert tx.write(memoryview(payload[n:])) == len(payload) - n
        if not conn.rx.ctl[WATCHING] and not conn.rx.ctl[QUIET]:  # the lane's rule, after its fence
            a._engine.pair_hub.ring(1)
        y = poisoned(n, np.int32)
        await asyncio.wait_for(b.irecv(y, 0, tag), 10)
        assert (y == data(n, np.int32, tag)).all()

    pair(body)


def test_another_tag_first_in_the_fifo_goes_the_general_way() -> None:
    async def body(a: aioccl.Communicator, b: aioccl.Communicator) -> None:
        await a.isend(data(2, np.uint8, 1), 1, 1)
        await a.isend(data(2, np.uint8, 2), 1, 2)
        y2, y1 = poisoned(2, np.uint8), poisoned(2, np.uint8)
        await b.irecv(y2, 0, 2)  # tag 1 is first in the FIFO: the engine reads both, tag 1 is held
        await b.irecv(y1, 0, 1)
        assert (y1 == data(2, np.uint8, 1)).all() and (y2 == data(2, np.uint8, 2)).all(), (y1, y2)

    pair(body)


def test_a_send_behind_a_rendezvous_waits_its_turn() -> None:
    """A send queued in the engine (here a rendezvous over the eager limit) keeps later sends behind it."""
    async def body(a: aioccl.Communicator, b: aioccl.Communicator) -> None:
        big = data((a._engine.eager >> 2) + 5, np.float32, 1)
        small = data(6, np.float32, 2)
        sent = counts(a)[0]
        s1, s2 = a.isend(big, 1, 9), a.isend(small, 1, 9)
        assert counts(a)[0] == sent and not s2.done()
        y1, y2 = poisoned(big.size, np.float32), poisoned(6, np.float32)
        await asyncio.gather(s1, s2, b.irecv(y1, 0, 9), b.irecv(y2, 0, 9))
        assert (y1 == big).all() and (y2 == small).all()
        await asyncio.gather(a.isend(small, 1, 9), b.irecv(y2, 0, 9))  # and the lane again once it is through
        assert counts(a)[0] == sent + 1

    pair(body)


def test_a_mismatch_fails_the_receive_and_the_pair_goes_on() -> None:
    async def body(a: aioccl.Communicator, b: aioccl.Communicator) -> None:
        await a.isend(data(5, np.int32), 1, 3)
        with pytest.raises(CollectiveMismatch, match="recv"):
            await b.irecv(poisoned(6, np.int32), 0, 3)
        with pytest.raises(CollectiveMismatch):
            await asyncio.gather(a.isend(data(4, np.float32), 1, 3), b.irecv(poisoned(4, np.int32), 0, 3))
        y = poisoned(5, np.int32)
        await asyncio.gather(a.isend(data(5, np.int32, 3), 1, 3), b.irecv(y, 0, 3))
        assert (y == data(5, np.int32, 3)).all()

    pair(body)


def test_bad_input_raises_before_a_byte_moves_and_other_arrays_go_the_general_way() -> None:
    async def body(a: aioccl.Communicator, b: aioccl.Communicator) -> None:
        x = data(8, np.int32)
        sent = counts(a)
        for peer, tag in ((2, 0), (-1, 0), (1, -3), (1, 1 << 62), (True, 0)):
            with pytest.raises(InvalidArgument):
                a.isend(x, peer, tag)
        with pytest.raises(InvalidArgument):
            b.irecv(np.zeros(4, np.int32), 0, 1 << 62)
        ro = np.zeros(8, np.int32)
        ro.setflags(write=False)
        for bad in (lambda: b.irecv(ro, 0, 0), lambda: b.irecv(np.zeros(16, np.int32)[::2], 0, 0),
                    lambda: a.isend(data(16, np.int32)[::2], 1, 0)):
            with pytest.raises(InvalidArgument):
                bad()
        assert counts(a) == sent and b._engine.mailbox.p2p_posted == {}

        class Sub(np.ndarray):
            pass

        y = poisoned(8, np.int32)
        await asyncio.gather(a.isend(data(8, np.int32, 4).view(Sub), 1, 0), b.irecv(y.view(Sub), 0, 0))
        assert counts(a) == sent and (y == data(8, np.int32, 4)).all()  # a subclass: the general way
        await a.close()
        with pytest.raises(aioccl.AiocclError):
            a.isend(x, 1, 0)
        assert not a._pair.native.enabled

    pair(body)


def test_a_full_fifo_of_unclaimed_messages_never_holds_back_the_one_awaited(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4 KiB FIFO filled with messages nobody has asked for yet, and the message the receiver waits for
    behind them: the sender waits for room, so the engine reads the others in, and the awaited one comes."""
    monkeypatch.setenv("AIOCCL_SHM_RING", "4096")

    async def body(a: aioccl.Communicator, b: aioccl.Communicator) -> None:
        # 64-byte frames (a header and 4 int32): 64 fill the FIFO exactly, so no byte of the next is in it
        sends = [a.isend(data(4, np.int32, k), 1, 1) for k in range(200)] + [a.isend(data(4, np.int32, 999), 1, 2)]
        y = poisoned(4, np.int32)
        await asyncio.wait_for(b.irecv(y, 0, 2), 10)
        assert (y == data(4, np.int32, 999)).all()
        for k in range(200):
            await asyncio.wait_for(b.irecv(y, 0, 1), 10)
            assert (y == data(4, np.int32, k)).all(), (k, y)
        await asyncio.gather(*sends)

    pair(body)


@pytest.mark.parametrize("ring", ["4096", "65536", "4194304"])
def test_streams_between_processes_exact_with_frames_round_the_fifo(ring: str) -> None:
    """Real processes, every size from 0 to past the FIFO, both directions at once: every message exact, in
    order, most through the lane. Small FIFOs: frames wrap round the end, longer ones stream through it in
    Python; the default one: large frames copied out by the lane as they stream in."""
    r = launch(2, "pair_lane.py", env={"AIOCCL_SHM_RING": ring}, timeout=180)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    oks = [line for line in r.stdout.splitlines() if "PAIRLANE OK" in line]
    assert len(oks) == 2, r.stdout[-2000:]
    for line in oks:
        sent, received = map(int, line.split("PAIRLANE OK", 1)[1].split())
        assert sent > 100 and received > 50, line
