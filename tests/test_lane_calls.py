"""The CPU lane's other collectives (native/src/py/lane_calls.c, taught by aioccl/lanes/cpu.py): every form
exact in real processes, run in C after its first call; a mismatch, bad input, a group and a late peer
behave as on the general way."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import aioccl
from aioccl import native
from aioccl.errors import CollectiveMismatch

from conftest import close_all, launch, make_comms

pytestmark = pytest.mark.skipif(native.core is None, reason=f"native core: {native.status()}")


def _lines(proc, key: str) -> list[str]:
    return [ln for ln in proc.stdout.splitlines() if key in ln]


def test_every_form_is_exact_and_runs_in_the_lane_after_its_first_call():
    """2 ranks, a spin long enough that no op is handed to the engine: every form of every collective runs
    in C on its second and third call (LANE_CALLS_EXPECT), numpy arrays and CPU torch tensors."""
    proc = launch(2, "lane_calls.py", env={"AIOCCL_SHM_SPIN_US": "1000000", "LANE_CALLS_EXPECT": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ok = _lines(proc, "LANE_CALLS OK")
    assert len(ok) == 2 and all(int(ln.split("ran=")[1].split()[0]) >= 136 for ln in ok), ok


@pytest.mark.parametrize("env", [{}, {"AIOCCL_NATIVE": "0"}], ids=["lane", "python"])
def test_three_ranks_with_late_peers_are_exact_on_both_paths(env):
    """3 ranks on this machine's cores: ops often wait for a peer and are carried on by the engine (the
    hand-over), and some calls find the channel busy and go the general way; every result is exact."""
    proc = launch(3, "lane_calls.py", env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(_lines(proc, "LANE_CALLS OK")) == 3, proc.stdout[-2000:]


async def _teach(comms, call) -> None:
    """Run ``call(c)`` on every rank twice (the general way, then the lane)."""
    for _ in range(2):
        await asyncio.gather(*(call(c) for c in comms))


async def test_a_mismatch_after_the_lane_learnt_both_forms_fails_every_rank_and_the_next_op_is_exact():
    comms = await make_comms(2)
    try:
        for root in (0, 1):
            await _teach(comms, lambda c, root=root: c.broadcast(np.zeros(4, np.float32), root=root))
        for c in comms:  # from now on the general way must not see these calls: the lane takes them
            c._broadcast = lambda *a: pytest.fail("a call of a learnt form went the general way")
        got = await asyncio.gather(*(c.broadcast(np.zeros(4, np.float32), root=c.rank) for c in comms),
                                   return_exceptions=True)
        assert all(isinstance(e, CollectiveMismatch) for e in got), got
        ys = [np.full(4, c.rank + 5, np.float32) for c in comms]
        await asyncio.gather(*(c.broadcast(y, root=1) for c, y in zip(comms, ys, strict=True)))
        assert all((y == 6).all() for y in ys)
    finally:
        await close_all(comms)


async def test_bad_input_after_the_lane_learnt_the_form_is_refused_before_anything_is_sent():
    comms = await make_comms(2)
    try:
        await _teach(comms, lambda c: c.all_gather(np.ones(3, np.float32), out=np.zeros(6, np.float32)))
        c = comms[0]
        seq, ran = c._seq, c._cpu.native.ran
        ro = np.zeros(6, np.float32)
        ro.flags.writeable = False
        big = np.zeros(12, np.float32)
        bad = [(np.ones(3, np.float32), np.zeros(5, np.float32)),  # out of the wrong size
               (np.ones(3, np.float32), np.zeros(6, np.float64)),  # of another dtype
               (np.ones(3, np.float32), ro),  # read-only
               (np.ones(3, np.float32), big[::2]),  # not contiguous
               (big[1:4], big[:6]),  # x overlaps out other than as its block 0
               (np.ones(3, np.complex64), np.zeros(6, np.complex64))]  # an unsupported dtype
        for x, out in bad:
            with pytest.raises(aioccl.InvalidArgument):
                c.all_gather(x, out=out)
        assert c._seq == seq and c._cpu.native.ran == ran, "a refused call took a sequence number"
        outs = [np.zeros(6, np.float32) for _ in comms]
        await asyncio.gather(*(c.all_gather(np.full(3, c.rank + 1, np.float32), out=o)
                               for c, o in zip(comms, outs, strict=True)))
        assert all((o == np.repeat([1, 2], 3)).all() for o in outs)
    finally:
        await close_all(comms)


async def test_a_group_and_a_late_peer_take_the_engine_and_stay_exact():
    """Inside ``comm.group()`` the lane stays out (the ops launch together at the exit); with the peers in one
    thread here, every lane call waits for the other rank and is carried on by the engine."""
    comms = await make_comms(2)
    try:
        await _teach(comms, lambda c: c.reduce_scatter(np.ones(4, np.int64), out=np.zeros(2, np.int64)))

        async def grouped(c: aioccl.Communicator, outs: list[np.ndarray]) -> None:
            async with c.group():
                c.reduce_scatter(np.arange(4, dtype=np.int64) + c.rank, out=outs[0])
                c.reduce_scatter(np.arange(4, dtype=np.int64) * c.rank, "max", out=outs[1])

        outs = [[np.zeros(2, np.int64), np.zeros(2, np.int64)] for _ in comms]
        await asyncio.gather(*(grouped(c, o) for c, o in zip(comms, outs, strict=True)))
        for r, (a, b) in enumerate(outs):
            assert (a == 2 * np.arange(4)[2 * r:2 * r + 2] + 1).all() and (b == np.arange(4)[2 * r:2 * r + 2]).all()
        for _ in range(5):
            outs1 = [np.zeros(2, np.int64) for _ in comms]
            await asyncio.gather(*(c.reduce_scatter(np.arange(4, dtype=np.int64) + 10 * c.rank, out=o)
                                   for c, o in zip(comms, outs1, strict=True)))
            assert all((o == 2 * np.arange(4)[2 * r:2 * r + 2] + 10).all() for r, o in enumerate(outs1))
        assert all(c.pending() == [] for c in comms)
    finally:
        await close_all(comms)
