"""Receives from any source or with any tag: MPI's matching rules, on the mailbox alone (no sockets).

Frames are fed to ``Mailbox.on_header`` as a connection's reader would; receives are posted as the
engine would. The multi-process checks over every transport are in test_p2p_and_sync_multiprocess.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from aioccl import ANY_SOURCE, ANY_TAG, Status
from aioccl.engine.mailbox import Mailbox
from aioccl.engine.pool import BufferPool
from aioccl.errors import CollectiveMismatch, PeerLost
from aioccl.transport.frames import P2P, Header
from aioccl.work import Work

from conftest import close_all, make_comms

CTX, ME = 7, 0
RANKS = (-1, 1, 2, 3)  # the communicator's world ranks, this rank's as -1


@pytest.fixture
def box() -> Iterator[Mailbox]:
    loop = asyncio.new_event_loop()
    yield Mailbox(loop, BufferPool())
    loop.close()


def arrive(box: Mailbox, peer: int, tag: int, value: int, ctx: int = CTX) -> None:
    """A 4-byte int32 message ``value`` from ``peer``, read in by the mailbox."""
    payload = np.array([value], np.int32).tobytes()
    view, finish = box.on_header(peer, Header(P2P, 0, 5, 0, ctx, tag, len(payload)))
    view[:] = payload
    finish()


class Recv:
    """A posted receive: its buffer (poisoned), work and future."""

    def __init__(self, box: Mailbox, src: int, tag: int, size: int = 1) -> None:
        self.buf = np.full(size, -99, np.int32)
        self.work: Work[Any] = Work(f"recv({src}, {tag})", tag, cancellable=True)
        target = memoryview(self.buf).cast("B")
        if src >= 0 and tag >= 0:
            fut = box.post_p2p(src, CTX, tag, target, 5, self.work.op, self.work)
            self.work.status = Status(RANKS.index(src), tag)
        else:
            fut = box.post_any(src, CTX, tag, RANKS, target, 5, self.work.op, self.work)
        assert fut is not None
        self.fut = fut

    def got(self) -> tuple[int, int, int] | None:
        """(value, source, tag) once matched and arrived; None while it waits."""
        if not self.fut.done():
            return None
        assert self.fut.exception() is None, self.fut.exception()
        return int(self.buf[0]), self.work.status.source, self.work.status.tag


def test_a_wildcard_takes_the_earliest_arrival_that_fits(box: Mailbox) -> None:
    arrive(box, 2, 5, 20)
    arrive(box, 1, 6, 10)
    arrive(box, 1, 5, 11)
    assert Recv(box, ANY_SOURCE, 5).got() == (20, 2, 5)
    assert Recv(box, 1, ANY_TAG).got() == (10, 1, 6)  # from rank 1: its first message, whatever its tag
    assert Recv(box, ANY_SOURCE, ANY_TAG).got() == (11, 1, 5)
    assert not box.p2p_early


def test_per_source_order_is_kept_across_tags(box: Mailbox) -> None:
    for i, tag in enumerate([3, 1, 2, 1]):
        arrive(box, 3, tag, 100 + i)
    got = [Recv(box, 3, ANY_TAG).got() for _ in range(4)]
    assert got == [(100, 3, 3), (101, 3, 1), (102, 3, 2), (103, 3, 1)]


def test_a_message_goes_to_the_earliest_posted_receive_that_fits(box: Mailbox) -> None:
    specific = Recv(box, 1, 5)
    wild = Recv(box, ANY_SOURCE, 5)
    later = Recv(box, 1, 5)
    arrive(box, 1, 5, 1)
    arrive(box, 1, 5, 2)
    arrive(box, 1, 5, 3)
    assert (specific.got(), wild.got(), later.got()) == ((1, 1, 5), (2, 1, 5), (3, 1, 5))


def test_a_wildcard_posted_first_comes_first(box: Mailbox) -> None:
    wild = Recv(box, ANY_SOURCE, ANY_TAG)
    specific = Recv(box, 2, 8)
    arrive(box, 2, 8, 1)
    assert wild.got() == (1, 2, 8) and specific.got() is None
    arrive(box, 2, 8, 2)
    assert specific.got() == (2, 2, 8)


def test_a_wildcard_never_takes_what_does_not_fit(box: Mailbox) -> None:
    wild_tag = Recv(box, ANY_SOURCE, 4)
    from_two = Recv(box, 2, ANY_TAG)
    arrive(box, 1, 9, 1)  # neither fits: it waits for its own receive
    assert wild_tag.got() is None and from_two.got() is None
    arrive(box, 2, 4, 3)  # fits both: the one posted first
    assert wild_tag.got() == (3, 2, 4) and from_two.got() is None
    arrive(box, 2, 5, 4)
    assert from_two.got() == (4, 2, 5)
    assert Recv(box, 1, 9).got() == (1, 1, 9)


def test_a_cancelled_wildcard_steps_aside(box: Mailbox) -> None:
    gone = Recv(box, ANY_SOURCE, ANY_TAG)
    kept = Recv(box, ANY_SOURCE, ANY_TAG)
    assert gone.work.cancel()
    arrive(box, 1, 0, 5)
    assert kept.got() == (5, 1, 0) and not gone.fut.done()


def test_a_wildcard_of_another_communicator_is_not_consulted(box: Mailbox) -> None:
    wild = Recv(box, ANY_SOURCE, ANY_TAG)
    arrive(box, 1, 0, 5, ctx=CTX + 1)
    assert wild.got() is None
    assert list(box.p2p_early) == [(1, CTX + 1, 0)]


def test_a_wrong_size_fails_the_receive_that_took_it(box: Mailbox) -> None:
    arrive(box, 2, 0, 5)
    r = Recv(box, ANY_SOURCE, ANY_TAG, size=3)
    with pytest.raises(CollectiveMismatch, match="rank 2 sent"):
        r.fut.result()


def test_a_crashed_rank_fails_a_receive_from_any_source(box: Mailbox) -> None:
    """As ULFM's MPI_ERR_PROC_FAILED_PENDING: the message it waits for may have been the lost rank's."""
    any_source, from_one, from_three = Recv(box, ANY_SOURCE, 0), Recv(box, 1, ANY_TAG), Recv(box, 3, ANY_TAG)
    box.on_lost(2, ConnectionResetError("reset"), graceful=False)
    with pytest.raises(PeerLost, match="rank 2"):
        any_source.fut.result()
    assert not from_one.fut.done() and not from_three.fut.done()
    with pytest.raises(PeerLost, match="rank 2"):
        Recv(box, ANY_SOURCE, ANY_TAG).fut.result()  # posted after the loss: at once


def test_a_closed_rank_fails_it_only_once_no_rank_may_send(box: Mailbox) -> None:
    r = Recv(box, ANY_SOURCE, ANY_TAG)
    box.on_lost(1, EOFError(), graceful=True)
    box.on_lost(2, EOFError(), graceful=True)
    assert not r.fut.done()
    arrive(box, 3, 0, 7)
    assert r.got() == (7, 3, 0)
    last = Recv(box, ANY_SOURCE, ANY_TAG)
    box.on_lost(3, EOFError(), graceful=True)
    with pytest.raises(PeerLost, match="closed"):
        last.fut.result()


def test_a_timed_out_wildcard_leaves_the_queue(box: Mailbox) -> None:
    late = Recv(box, ANY_SOURCE, ANY_TAG)
    box.withdraw(-1, CTX, -1, late.fut)
    arrive(box, 1, 0, 5)
    assert late.got() is None and (1, CTX, 0) in box.p2p_early


@pytest.mark.asyncio
@pytest.mark.parametrize("transport", ["ib", "shm"])
@pytest.mark.parametrize("eager", ["1048576", "256"])
async def test_any_source_over_a_transport(transport: str, eager: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks in this process over the ib transport (its loopback verbs backend) or shared memory: small and
    rendezvous messages (a 4 KiB message over a 256 B eager limit) taken from any source, every element exact."""
    monkeypatch.setenv("AIOCCL_P2P_EAGER", eager)
    comms = await make_comms(3, transport=transport)
    try:
        bufs = [np.full(1024, -1, np.int32) for _ in range(4)]
        recvs = [comms[0].irecv(b, ANY_SOURCE, ANY_TAG) for b in bufs]
        sends = [comms[s].isend(np.arange(1024, dtype=np.int32) * s + i, 0, tag=i) for s in (1, 2) for i in (0, 1)]
        await asyncio.gather(*recvs, *sends)
        got = sorted((w.status.source, w.status.tag) for w in recvs)
        assert got == [(1, 0), (1, 1), (2, 0), (2, 1)]
        for w, b in zip(recvs, bufs, strict=True):
            np.testing.assert_array_equal(b, np.arange(1024, dtype=np.int32) * w.status.source + w.status.tag)
        per_source = {s: [w.status.tag for w in recvs if w.status.source == s] for s in (1, 2)}
        assert per_source == {1: [0, 1], 2: [0, 1]}  # from one sender, in the order sent
    finally:
        await close_all(comms)


def test_a_crash_after_a_close_names_the_crashed_rank(box: Mailbox) -> None:
    r = Recv(box, ANY_SOURCE, ANY_TAG)
    box.on_lost(1, EOFError(), graceful=True)
    assert not r.fut.done()
    box.on_lost(3, ConnectionResetError("reset"), graceful=False)
    with pytest.raises(PeerLost, match="rank 3"):
        r.fut.result()
