"""Shared memory as a transport between two ranks: the byte FIFO alone, then p2p, child communicators
and a lost peer over it in real processes."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from aioccl.transport.cma import PeerMemory, cookie
from aioccl.transport.shm.fifo import ByteFifo, fifo_bytes

from conftest import ROOT, WORKERS, orphaned_segments, shm_segments


def test_a_ring_carries_a_byte_stream_exactly_across_wrap_arounds():
    cap = 256
    fifo = ByteFifo(bytearray(fifo_bytes(cap)), 0, cap)
    rng = np.random.default_rng(5)
    stream = rng.integers(0, 256, 20_000, dtype=np.uint8)
    out = np.full(stream.size, 0xEE, np.uint8)  # poisoned
    wrote = read = 0
    while read < stream.size:
        k = int(rng.integers(1, 300))
        n = fifo.write(memoryview(stream[wrote:wrote + k]))
        assert n == min(k, stream.size - wrote, cap - (wrote - read))  # all that fits, never more
        wrote += n
        assert fifo.available() == wrote - read and fifo.free() == cap - (wrote - read)
        k = int(rng.integers(1, 300))
        got = fifo.read_into(memoryview(out[read:read + k]))
        assert got == min(k, wrote - read)
        read += got
    assert (out == stream).all()
    assert fifo.write(memoryview(bytes(cap))) == cap and fifo.write(memoryview(b"x")) == 0  # full
    assert not fifo.producer_blocked()
    fifo.set_blocked(True)
    assert fifo.producer_blocked()


def test_a_ring_refuses_a_capacity_it_cannot_align():
    with pytest.raises(ValueError, match="multiple of 64"):
        ByteFifo(bytearray(1024), 0, 100)


def run(scenario: str, n: int, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(ROOT), "AIOCCL_SHM_DISABLE": "0", "AIOCCL_NET": "socket",
            "AIOCCL_SHM_RING": "65536", **env}
    return subprocess.run([sys.executable, "-m", "aioccl.run", "--keep-going", "--nproc-per-node", str(n),
                           str(WORKERS / "shm_pairs.py"), scenario], env=full, capture_output=True, text=True,
                          timeout=180)


CMA_HERE = PeerMemory.open(cookie()) is not None  # may this process read its own memory by pid here?


@pytest.mark.parametrize(("n", "cma"), [(2, "1"), (3, "1"), (2, "0")])
def test_point_to_point_runs_over_shared_memory_pairs_bit_exact(n, cma):
    """Every size on every pair at once; a message over the eager limit is read in place out of the
    sender's memory (cross-memory attach) where the kernel allows it, else it crosses the FIFO."""
    p = run("p2p", n, AIOCCL_SHM_CMA=cma)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    reads = [int(m) for m in re.findall(r" p2p 7 sizes, (\d+) read in place", p.stdout)]
    assert len(reads) == n, p.stdout
    assert all(k == (n - 1 if cma == "1" and CMA_HERE else 0) for k in reads), (reads, CMA_HERE)


@pytest.mark.parametrize("cma", ["1", "0"])
def test_collectives_over_pairs_send_large_messages_as_offers_read_in_place(cma):
    """Collectives on messages (ring, chain) over shared-memory pairs: a message of 1 MiB or more is offered
    and read in place where the kernel allows it (one copy, not two through the FIFO); exact either way."""
    p = run("coll_offers", 3, AIOCCL_SHM_CMA=cma, AIOCCL_ALGO="ring,chain")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    reads = [int(m) for m in re.findall(r" coll_offers, (\d+) read in place", p.stdout)]
    assert len(reads) == 3, p.stdout
    assert all(k > 10 for k in reads) if cma == "1" and CMA_HERE else all(k == 0 for k in reads), reads


@pytest.mark.skipif(not CMA_HERE, reason="the kernel refuses cross-memory attach (process_vm_readv) here")
def test_a_collective_offer_withdrawn_at_its_deadline_is_never_read():
    p = run("coll_withdrawn", 2, AIOCCL_ALGO="ring")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert p.stdout.count("coll_withdrawn") == 2, p.stdout


@pytest.mark.skipif(not CMA_HERE, reason="the kernel refuses cross-memory attach (process_vm_readv) here")
def test_a_large_send_withdrawn_at_its_deadline_is_never_read():
    p = run("withdrawn", 2)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert p.stdout.count("withdrawn") == 2, p.stdout


@pytest.mark.parametrize("engine", ["inline", "thread"])
def test_split_children_run_over_their_own_shared_memory_channel(engine):
    before = shm_segments()
    p = run("children", 3, SHM_PAIRS_ENGINE=engine)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert p.stdout.count(" children") == 3, p.stdout
    assert p.stdout.count(" child mismatch seq ") == 3, p.stdout
    assert not orphaned_segments(before), "a child's segments outlived the job"


@pytest.mark.parametrize("engine", ["inline", "thread"])
def test_one_executor_runs_shared_memory_and_message_steps_in_one_schedule(engine):
    p = run("mixed", 3, SHM_PAIRS_ENGINE=engine)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert p.stdout.count(" mixed schedule on the channel") == 3, p.stdout


def test_a_shrunk_communicator_runs_over_shared_memory_again():
    p = run("shrunk", 3)
    assert p.stdout.count("shrunk to 2 over shm") == 2, p.stdout[-3000:] + p.stderr[-3000:]




def test_a_peer_lost_over_a_shared_memory_pair_is_seen_at_once():
    p = run("peer_killed", 3)
    assert "OK 1 lost 2 after" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
    assert "first failure: rank 2 was killed by SIGKILL" in p.stderr


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_unexpected_large_sends_wait_at_the_sender_not_in_the_receivers_memory(transport):
    """40 x 4 MiB sent before any receive is posted: 160 MiB that, buffered, would grow the receiver."""
    p = run("backlog", 2, AIOCCL_SHM_DISABLE="1" if transport == "tcp" else "0")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    m = re.search(r"OK 1 backlog 40 intact, grew (-?\d+) MiB", p.stdout)
    assert m and int(m.group(1)) <= 32, p.stdout
    assert "OK 0 sent 40" in p.stdout


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_unexpected_eager_sends_past_the_budget_wait_at_the_sender(transport):
    """400 x 256 KiB (100 MiB) eager sends before any receive, the receiver asleep for 3 s (past the
    2 s peer timeout): it holds at most its 16 MiB budget (plus one read's overshoot), the paused
    connection survives, every message arrives intact and in order."""
    p = run("eager_backlog", 2, AIOCCL_SHM_DISABLE="1" if transport == "tcp" else "0",
            AIOCCL_UNEXPECTED_BYTES=str(16 << 20))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    m = re.search(r"OK 1 eager backlog 400 intact, grew (-?\d+) MiB", p.stdout)
    assert m and int(m.group(1)) <= 32, p.stdout
    assert "OK 0 sent 400 eager" in p.stdout


def test_a_root_running_ahead_is_held_back_by_the_peers_budget():
    """Over sockets, a root broadcasting 150 x 1 MiB while its peer sleeps no longer grows the peer by 150 MiB."""
    p = run("bcast_ahead", 2, AIOCCL_SHM_DISABLE="1", AIOCCL_UNEXPECTED_BYTES=str(16 << 20))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    m = re.search(r"OK 1 broadcast ahead 150 intact, grew (-?\d+) MiB", p.stdout)
    assert m and int(m.group(1)) <= 40, p.stdout


@pytest.mark.skipif(not CMA_HERE, reason="the kernel refuses cross-memory attach (process_vm_readv) here")
def test_the_offer_handshake_never_lets_a_read_overlap_a_withdrawn_send():
    """Offers and takers in one process (it reads its own memory by pid): each order of take and
    withdraw, a stale look at a reused slot, and a full table."""
    from aioccl.engine.p2p.offers import DECLINED, READ, SLOTS, Offer, Taker
    from aioccl.transport.cma import PeerMemory

    mem, taker = PeerMemory(os.getpid()), Taker()
    data = np.arange(1000, dtype=np.int32)
    target = np.full(1000, -7, np.int32)

    a = Offer.make(memoryview(data))
    assert a is not None and taker.take(mem, a.packed, memoryview(target).cast("B")) == READ
    assert (target == data).all() and a.taken() and not a.withdraw()  # taken: the sender must wait for it
    a.release()

    target[:] = -7
    b = Offer.make(memoryview(data))
    assert b is not None and b.withdraw()  # nobody took it: the buffer is the user's again
    assert taker.take(mem, b.packed, memoryview(target).cast("B")) == DECLINED and (target == -7).all()
    b.release()

    c = Offer.make(memoryview(data))
    d = None
    assert c is not None
    c.release()
    d = Offer.make(memoryview(data))  # the same slot, another offer: a look through c's RTS is stale
    assert d is not None and d.slot == c.slot
    assert taker.take(mem, c.packed, memoryview(target).cast("B")) == DECLINED and (target == -7).all()
    assert not d.taken()
    d.release()

    held = [Offer.make(memoryview(data)) for _ in range(SLOTS)]
    assert all(o is not None for o in held) and Offer.make(memoryview(data)) is None  # full: send by CTS
    for o in held:
        assert o is not None
        o.release()
