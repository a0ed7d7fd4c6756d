"""The shared-memory transport: selection, segment lifetime (no leaks, even after kill -9),
registered buffers, deadlines, mismatches and wake-ups."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import aioccl
from aioccl.transport.shm.segment import SHM_DIR, segment_name, sweep_stale

from conftest import WORKERS, close_all, launch, make_comms, orphaned_segments, shm_segments

pytestmark = pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason=f"no {SHM_DIR} on this machine")


def segments() -> set[str]:
    """This process's segments (the communicators these tests make in it)."""
    return shm_segments((os.getpid(),))


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


async def test_same_host_ranks_pick_shared_memory_and_disable_forces_sockets():
    before = segments()
    comms = await make_comms(2)
    tcp = await make_comms(2, transport="tcp")
    try:
        assert [c.transport for c in comms] == ["shm", "shm"]
        assert [c.transport for c in tcp] == ["tcp", "tcp"]
        # segments are unlinked as soon as every rank has mapped them: nothing is left to leak
        assert segments() == before
        xs = [np.arange(5, dtype=np.float32) + c.rank for c in comms]
        await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, xs, strict=True)))
        assert all((x == 2 * np.arange(5) + 1).all() for x in xs)
    finally:
        await close_all(comms + tcp)
    assert segments() == before


async def test_abort_leaves_nothing_behind():
    before = segments()
    comms = await make_comms(3)
    pending = [c.all_reduce(np.ones(10)) for c in comms[:2]]
    for c in comms:
        c.abort()
    for w in pending:
        with pytest.raises(aioccl.AiocclError):
            await asyncio.wait_for(w, 10)
    assert segments() == before


def test_killed_run_leaves_no_segments(tmp_path):
    before = shm_segments()
    # the launcher is killed too: the folder it would have removed on its way out lands in tmp_path
    proc = subprocess.Popen([sys.executable, "-m", "aioccl.run", "--nproc-per-node", "3", "--no-prefix",
                             str(WORKERS / "shm_hold.py")], stdout=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    pids = []
    try:
        deadline = time.monotonic() + 60
        assert proc.stdout is not None
        while len(pids) < 3 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.startswith("ready pid="):
                pids.append(int(line.split("=")[1]))
        assert len(pids) == 3, "the ranks did not come up"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)  # no cleanup code runs at all
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    assert not orphaned_segments(before)
    assert not shm_segments((*pids, proc.pid))


def test_segments_of_dead_processes_are_swept(tmp_path):
    dead, old = dead_pid(), time.time() - 3600
    stale = tmp_path / segment_name(7, 0, dead)
    young = tmp_path / segment_name(7, 1, dead)  # may be a rank of another job still bootstrapping
    live = tmp_path / segment_name(7, 2, os.getpid())
    other = tmp_path / "not-ours"
    for f in (stale, young, live, other):
        f.write_bytes(b"x")
    for f in (stale, live, other):
        os.utime(f, (old, old))
    assert sweep_stale(str(tmp_path)) == [stale.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([young.name, live.name, other.name])


async def test_registered_buffers_are_read_in_place(monkeypatch):
    monkeypatch.setenv("AIOCCL_SHM_CMA_MIN_BYTES", "65536")  # a plain buffer this small is staged, not read in place
    comms = await make_comms(2)
    try:
        arrs = [c.alloc((4, 8), np.float32) for c in comms]
        assert all(a.shape == (4, 8) and a.dtype == np.float32 and not a.any() for a in arrs)
        ch = comms[0]._state.shm
        assert ch is not None and ch.heap_offset(arrs[0]) >= 0 and ch.heap_offset(arrs[0][1:3]) >= 0
        assert ch.heap_offset(np.zeros(4)) == -1
        slots = ch.u8[0][4096:4096 + 2 * ch.cap_bytes]
        for x, c in zip(arrs, comms, strict=True):
            x[...] = np.arange(32).reshape(4, 8) + c.rank
        outs = [np.full((4, 8), np.nan, np.float32) for _ in comms]
        slots[...] = 0xAB
        await asyncio.gather(*(c.all_reduce(x, out=o) for c, x, o in zip(comms, arrs, outs, strict=True)))
        want = 2 * np.arange(32).reshape(4, 8) + 1
        assert all((o == want).all() for o in outs)
        assert (slots == 0xAB).all(), "a registered input must not be staged"
        plain = [np.arange(32, dtype=np.float32).reshape(4, 8) + c.rank for c in comms]
        await asyncio.gather(*(c.all_reduce(x, out=o) for c, x, o in zip(comms, plain, outs, strict=True)))
        assert all((o == want).all() for o in outs)
        assert not (slots == 0xAB).all(), "a plain input is staged"
    finally:
        await close_all(comms)


async def test_alloc_frees_on_gc_and_reports_a_full_heap():
    comms = await make_comms(2)
    tcp = await make_comms(1, transport="tcp")
    try:
        heap = comms[0]._state.shm.heap
        a = comms[0].alloc(1000, np.int32)
        view = a[10:20]
        del a
        gc.collect()
        assert heap.used_blocks() == 1, "a view keeps the block alive"
        del view
        gc.collect()
        assert heap.used_blocks() == 0 and heap.free_bytes() == heap.size
        with pytest.raises(MemoryError, match="AIOCCL_SHM_HEAP"):
            comms[0].alloc(heap.size + 1, np.uint8)
        with pytest.raises(aioccl.InvalidArgument):
            comms[0].alloc((2, -1))
        with pytest.raises(aioccl.InvalidArgument):
            comms[0].alloc(4, object)
        plain = tcp[0].alloc((2, 3), np.float64)  # no shared memory: an ordinary zeroed array
        assert plain.shape == (2, 3) and not plain.any()
    finally:
        await close_all(comms + tcp)


async def test_timeout_names_the_silent_rank_and_the_channel_stays_in_step():
    comms = await make_comms(3)
    try:
        works = [c.all_reduce(np.ones(4), timeout=0.3) for c in comms[:2]]
        for w in works:
            with pytest.raises(aioccl.CollectiveTimeout, match=r"shared memory") as info:
                await w
            assert info.value.waiting_for == [2] and info.value.seq == 0
        # the late rank gets the same timeout, never the sum the others gave up on
        with pytest.raises(aioccl.CollectiveTimeout, match=r"reported by rank [01]") as late:
            await comms[2].all_reduce(np.ones(4), timeout=0.3)
        assert late.value.waiting_for == [2] and late.value.seq == 0
        xs = [np.full(4, c.rank + 1.0) for c in comms]
        await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, xs, strict=True)))
        assert all((x == 6).all() for x in xs)
        assert all(c._state.shm.broken is None and c._state.shm.stats["resyncs"] == 1 for c in comms)
    finally:
        for c in comms:
            c.abort()


async def test_a_mismatch_leaves_the_channel_in_step():
    comms = await make_comms(3)
    try:
        r = await asyncio.gather(comms[0].broadcast(np.ones(4), root=0), comms[1].broadcast(np.ones(4), root=1),
                                 comms[2].broadcast(np.ones(4), root=0), return_exceptions=True)
        assert all(isinstance(e, aioccl.OpMismatch) and "root 1" in str(e) for e in r), r
        xs = [np.full(3, c.rank + 1.0) for c in comms]
        await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, xs, strict=True)))
        assert all((x == 6).all() for x in xs)
    finally:
        await close_all(comms)


@pytest.mark.parametrize("engine", ["inline", "thread"])
async def test_parked_ranks_are_woken_by_the_doorbell(engine):
    """Ranks sharing one loop (or one proxy thread each) cannot all spin: they park and are rung awake.
    The backup re-check timer must never be what finds a step completed."""
    comms = await make_comms(2, engine=engine)
    try:
        xs = [np.ones(64, np.float32) for _ in comms]
        for _ in range(200):
            await asyncio.gather(*(c.all_reduce(x, op="max") for c, x in zip(comms, xs, strict=True)))
        stats = [c._state.shm.counts() for c in comms]
        assert all(s["ops"] >= 200 for s in stats), stats
        if engine == "inline":
            assert sum(s["parks"] for s in stats) > 0, stats
            assert all(s["recheck_hits"] == 0 for s in stats), stats
        else:  # two proxy threads share one GIL: a loop held up past the 5 ms re-check may race its bell
            assert all(s["recheck_hits"] <= max(1, s["parks"] // 100) for s in stats), stats
    finally:
        await close_all(comms)


def test_the_channel_is_unanimous_and_pairs_are_chosen_each_alone():
    """Rank 1 refuses shared memory: no rank runs collectives over the shared-memory channel, but the pair
    of the two willing ranks still talks over shared memory (the choice is per pair)."""
    proc = launch(3, "shm_one_refuses.py")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = sorted(ln.split("] ", 1)[-1] for ln in proc.stdout.splitlines() if "transport" in ln)
    assert lines == ["rank 0 transport shm+tcp to 0:self 1:tcp 2:shm ok True",
                     "rank 1 transport tcp to 0:tcp 1:self 2:tcp ok True",
                     "rank 2 transport shm+tcp to 0:shm 1:tcp 2:self ok True"], proc.stdout
