"""The point-to-point lane from other threads than the engine's (a proxy thread's engine borrowed for the
call: native/src/py/pair_native.c), and its single copy (a receive that spins announces its buffer, the
send writes into it: pair_direct.c, core/fifo.c's want). In one process, two communicators whose engines
run on proxy threads, over real shared-memory pairs.
"""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
from test_pair_lane import counts, data, poisoned

from aioccl import Status, native
from aioccl.transport.shm.fifo import WANT

from conftest import close_all, make_comms

pytestmark = pytest.mark.skipif(native.core is None, reason=f"the native core is not loaded: {native.status()}")


def test_from_another_thread_the_lane_borrows_a_proxy_engine() -> None:
    """Synchronous code (torch.distributed's backend, a script) calls from its own thread while a proxy thread
    runs the engine: the lane borrows the idle engine (its lock) for the call, as a small collective does,
    and a message the engine held is taken from the mailbox (its loop woken after). An engine busy past the
    pair's spin (a loaded machine) means the general way, so each case runs until the lane took it once;
    every message is exact either way."""
    async def main() -> None:
        a, b = await make_comms(2, engine="thread")
        try:
            assert a._pair.native is not None and b._engine.placement.kind == "thread"
            for k, n in enumerate((1, 1000, (80 << 10) // 4 + 3)):
                by_lane = 0
                for _ in range(8):
                    x, y = data(n, np.float32, k), poisoned(n, np.float32)
                    before = counts(a)[0], counts(b)[1]
                    w, r = a.isend(x, 1, 30 + k), b.irecv(y, 0, 30 + k)
                    await asyncio.gather(w, r)
                    assert np.array_equal(y, x), (n, y[:8])
                    by_lane += (counts(a)[0], counts(b)[1]) == (before[0] + 1, before[1] + 1)
                assert by_lane, n
            box, held = b._engine.mailbox, 0
            for _ in range(8):
                await a.isend(data(5, np.int64, 1), 1, 4)
                await a.isend(data(5, np.int64, 3), 1, 8)
                y3 = poisoned(5, np.int64)
                await b.irecv(y3, 0, 8, timeout=5)  # the engine's receive reads both in: tag 4's is held
                assert [key[2] for key in box.p2p_early] == [4] and (y3 == data(5, np.int64, 3)).all()
                y1, taken = poisoned(5, np.int64), counts(b)[1]
                await b.irecv(y1, 0, 4)
                assert (y1 == data(5, np.int64, 1)).all() and not box.p2p_early, y1
                held += counts(b)[1] == taken + 1
                y2 = poisoned(2, np.uint8)  # and the engine serves the general way after the wake-up
                await asyncio.gather(a.isend(data(2, np.uint8, 9), 1, 5, timeout=5), b.irecv(y2, 0, 5, timeout=5))
                assert (y2 == data(2, np.uint8, 9)).all()
            assert held
        finally:
            await close_all([a, b])

    asyncio.run(main())


def test_a_receive_that_waits_gets_its_message_written_straight_into_its_buffer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """From 64 KiB a receive that spins announces its buffer (the FIFO's want words), and the send writes the
    payload straight into it by cross-memory attach, then puts a header-only frame: one copy instead of two.
    Deterministic here: the receive spins on a thread of its own (a long spin), the send goes once the want
    is up."""
    monkeypatch.setenv("AIOCCL_SHM_SPIN_US", "5000000")

    async def main() -> None:
        a, b = await make_comms(2, engine="thread")
        try:
            rx = b._engine.conns[0]
            if rx.memory is None or a._engine.conns[1].memory is None:
                pytest.skip("the kernel lets no process here write another's memory (cross-memory attach)")
            for n, dt in (((64 << 10) // 4, np.float32), (300_001, np.uint8), (1 << 17, np.int64)):
                x, y, got = data(n, dt, 5), poisoned(n, dt), []
                before = a._pair.native.stats()["delivered"]
                t = threading.Thread(target=lambda y=y, got=got: got.append(b.irecv(y, 0, 3)))
                t.start()
                deadline = time.monotonic() + 10
                while rx.rx.ctl[WANT] == 0 and time.monotonic() < deadline:
                    time.sleep(0.0005)
                assert rx.rx.ctl[WANT] != 0, "the receive never announced its buffer"
                w = a.isend(x, 1, 3)
                t.join(10)
                assert w.done() and got and got[0].done(), (w, got)
                assert a._pair.native.stats()["delivered"] == before + 1
                assert np.array_equal(y, x) and got[0].status == Status(0, 3), (n, y[:8])
                assert rx.rx.ctl[WANT] == 0 and rx.rx.available() == 0
        finally:
            await close_all([a, b])

    asyncio.run(main())
