"""One door for every call (aioccl/lanes/): the lanes tried in one order, each declining for a reason it
declares, the docs' table of lanes held to those declarations, the LANES log and ``comm.explain``.

Every row of the table below is one declining condition of one lane, made real on real communicators in
this process (shared memory, two ranks): the lane's answer must be a ``Declined`` with that reason, and the
call must still complete exactly through the lanes after it."""

from __future__ import annotations

import ast
import asyncio
import inspect
import logging
from pathlib import Path

import numpy as np
import pytest
from lanes_table import LANES, render

import aioccl
from aioccl import native
from aioccl.lanes import door
from aioccl.lanes.call import RECV, SEND, Call
from aioccl.lanes.cpu import CAPTURE
from aioccl.native.answers import REASONS, Declined

from conftest import ROOT, close_all, make_comms

ALL_REDUCE, ALL_GATHER, BARRIER = 1, 4, 9
needs_native = pytest.mark.skipif(native.core is None, reason=f"native core: {native.status()}")


def test_the_docs_table_is_the_lanes_declared_rules():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert render() in doc, "docs/architecture.md's table of lanes differs from the lanes' RULES:\n" + render()
    for lane in LANES.values():
        assert all(reason in REASONS for reason, _ in lane.RULES), lane.name


def test_the_order_is_said_once_and_every_public_op_is_one_line_to_the_door():
    """No public collective or message decides a road of its own: each body is one call of the door, and
    the order (``door.ORDER``) is named nowhere else."""
    methods = {"all_reduce", "scan", "broadcast", "reduce", "all_gather", "reduce_scatter", "gather", "scatter",
               "all_to_all", "barrier", "isend", "irecv"}
    for name in methods:
        fn = ast.parse(inspect.getsource(getattr(aioccl.Communicator, name)).lstrip()).body[0]
        body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        assert len(body) == 1 and "self._door." in ast.unparse(body[0]), (name, ast.unparse(fn))
    said = [p for p in Path(ROOT, "aioccl").rglob("*.py") if '("cpu", "gpu", "general")' in p.read_text()]
    assert [p.name for p in said] == ["door.py"]
    assert door.ORDER == {"collective": ("cpu", "gpu", "general"), "message": ("pair", "general")}


def _answer(lane, call):
    """What a lane answers for a call, as the door asks it: its check, then its try."""
    return lane.check(call) or lane.try_call(call)


def _call(code, x=None, out=None, op="sum", root=0, timeout=None, stream=None, tag=0):
    return Call(code, x, out, op if code not in (SEND, RECV, BARRIER) else None, root, timeout, stream, None, tag)


# (lane, reason, how to make it): each returns (comm, call) made on the pair of communicators given
def _cpu_off(cs):
    cs[0]._cpu.off()
    return cs[0], _call(ALL_REDUCE, np.ones(4, np.float32))


def _cpu_buffers(cs):
    return cs[0], _call(ALL_REDUCE, np.ones(8, np.float32)[::2])  # not contiguous


def _cpu_size(cs):
    return cs[0], _call(ALL_REDUCE, np.ones(1024, np.float32))  # 4 KiB: past AIOCCL_NATIVE_MAX_BYTES (below)


def _cpu_form(cs):
    return cs[0], _call(ALL_GATHER, np.ones(3, np.float32), np.zeros(6, np.float32))  # never seen


def _gpu_off(cs):
    return cs[0], _call(ALL_REDUCE, np.ones(4, np.float32))  # no GPU op ever ran


def _pair_timeout(cs):
    return cs[0], _call(SEND, np.ones(4, np.float32), root=1, timeout=5.0)


def _pair_stream(cs):
    return cs[0], _call(SEND, np.ones(4, np.float32), root=1, stream=object())


def _pair_buffers(cs):
    return cs[0], _call(SEND, np.ones(8, np.float32)[::2], root=1)


def _pair_wildcard(cs):
    return cs[0], _call(RECV, np.ones(4, np.float32), root=aioccl.ANY_SOURCE)


def _pair_size(cs):
    return cs[0], _call(SEND, np.ones((2 << 20) // 4, np.float32), root=1)  # 2 MiB: past AIOCCL_P2P_EAGER


def _pair_off(cs):
    cs[0]._pair.off()
    return cs[0], _call(SEND, np.ones(4, np.float32), root=1)


ROWS = [
    ("cpu", "off", _cpu_off),
    ("cpu", "stream", lambda cs: (cs[0], _call(ALL_REDUCE, np.ones(4, np.float32), stream=object()))),
    ("cpu", "buffers", _cpu_buffers),
    ("cpu", "learning", None),  # (below: inside CAPTURE.learning())
    ("cpu", "form", _cpu_form),
    ("cpu", "size", _cpu_size),
    ("cpu", "group", None),  # (below: inside comm.group())
    ("gpu", "off", _gpu_off),
    ("pair", "off", _pair_off),
    ("pair", "timeout", _pair_timeout),
    ("pair", "stream", _pair_stream),
    ("pair", "buffers", _pair_buffers),
    ("pair", "wildcard", _pair_wildcard),
    ("pair", "size", _pair_size),
    ("pair", "group", None),  # (below)
    ("pair", "spun", None),  # (below: a receive nobody sends to)
]


@needs_native
@pytest.mark.parametrize(("lane", "reason", "make"), ROWS, ids=[f"{a}-{b}" for a, b, _ in ROWS])
async def test_each_lane_declines_for_its_reason(lane, reason, make, monkeypatch):
    if (lane, reason) == ("cpu", "size"):
        monkeypatch.setenv("AIOCCL_NATIVE_MAX_BYTES", "1000")
    comms = await make_comms(2)
    try:
        c = comms[0]
        the_lane = c._door.lanes[lane]
        if reason == "learning":
            with CAPTURE.learning():
                got = _answer(the_lane, _call(ALL_REDUCE, np.ones(4, np.float32)))
        elif reason == "group":
            await asyncio.gather(*(d.all_reduce(np.ones(4, np.float32)) for d in comms))  # the form, learnt
            async with c.group():
                x = np.ones(4, np.float32)
                got = _answer(the_lane, _call(ALL_REDUCE, x) if lane == "cpu" else _call(SEND, x, root=1))
                comms[1].all_reduce(np.ones(4, np.float32)) if lane == "cpu" else None
                if lane == "cpu":  # (the general way runs it in the group, with its peer)
                    c.all_reduce(x)
                else:
                    c.isend(x, 1)
            if lane == "pair":
                await comms[1].irecv(np.zeros(4, np.float32), 0)
        elif reason == "spun":
            got = _answer(the_lane, _call(RECV, np.zeros(4, np.float32), root=1, tag=77))
        else:
            _, call = make(comms)
            got = _answer(the_lane, call)
        assert isinstance(got, Declined) and got.reason == reason, got
        assert reason in {r for r, _ in LANES[lane].RULES}, f"{lane} declines for {reason} but does not declare it"
    finally:
        await close_all(comms)


async def test_a_declined_call_still_runs_exactly_through_the_lanes_after_it():
    """The same calls as the rows above, issued for real on both ranks: every element exact."""
    comms = await make_comms(2)
    try:
        for _ in range(3):  # the first teaches the CPU lane, the later ones run there
            xs = [np.arange(6, dtype=np.float32)[::2] * (c.rank + 1) for c in comms]  # not contiguous
            outs = await asyncio.gather(*(c.all_reduce(x, timeout=5.0) for c, x in zip(comms, xs, strict=True)))
            assert all((o == np.arange(6, dtype=np.float32)[::2] * 3).all() for o in outs)
            gathered = [np.full(6, -1, np.float32) for _ in comms]
            await asyncio.gather(*(c.all_gather(np.full(3, c.rank, np.float32), out=g)
                                   for c, g in zip(comms, gathered, strict=True)))
            assert all((g == [0, 0, 0, 1, 1, 1]).all() for g in gathered)
            buf = np.full(4, -1, np.int32)
            r = comms[1].irecv(buf, 0, tag=5, timeout=5.0)
            await comms[0].isend(np.arange(4, dtype=np.int32), 1, tag=5, timeout=5.0)
            await r
            assert (buf == np.arange(4)).all()
    finally:
        await close_all(comms)


@needs_native
async def test_the_lanes_log_names_who_took_an_out_all_reduce_with_a_timeout_and_why_others_declined(caplog):
    comms = await make_comms(2)
    try:
        with caplog.at_level(logging.INFO, logger="aioccl.LANES"):
            for _ in range(2):
                xs = [np.full(4, c.rank + 1, np.float32) for c in comms]
                outs = [np.full(4, -1, np.float32) for _ in comms]
                await asyncio.gather(*(c.all_reduce(x, out=o, timeout=5.0)
                                       for c, x, o in zip(comms, xs, outs, strict=True)))
                assert all((o == 3).all() for o in outs)
        lines = [r.getMessage() for r in caplog.records if r.name == "aioccl.LANES"]
        first = [m for m in lines if "general lane took it" in m]
        second = [m for m in lines if "the cpu lane took it" in m]
        assert first and "cpu declined: form" in first[0] and "gpu declined: off" in first[0], lines
        assert "timeout=5" in first[0] and "out=ndarray[4] float32" in first[0], first
        assert second and "timeout=5" in second[0], lines
        assert len(lines) == 2 * len(comms), lines  # once per call form and outcome, not once per call
    finally:
        await close_all(comms)


async def test_explain_answers_without_running_the_call():
    comms = await make_comms(2)
    try:
        c = comms[0]
        seq = c._seq
        x, out = np.ones(4, np.float32), np.zeros(4, np.float32)
        said = c.explain("all_reduce", x, out=out, timeout=5.0, stream=object())
        assert [lane for lane, _ in said] == ["cpu", "gpu", "general"], said
        assert said[0][1].startswith("declines: " + ("stream" if native.core is not None else "off"))
        assert said[-1] == ("general", "would take it")
        msg = c.explain("isend", x, root=1, timeout=1.0)
        assert msg[0][0] == "pair" and msg[-1] == ("general", "would take it"), msg
        assert c._seq == seq and (out == 0).all()  # nothing ran
        with pytest.raises(aioccl.InvalidArgument):
            c.explain("all_reduce", x, timeout=-1.0)  # the record checks the timeout before any lane
        with pytest.raises(aioccl.InvalidArgument, match="no op"):
            c.explain("allreduce", x)
    finally:
        await close_all(comms)


@needs_native
async def test_the_pair_lane_is_made_from_one_typed_setup_and_checks_the_mailboxs_key():
    """``PairSetup`` by name: a field of the wrong type is named; a mailbox whose point-to-point key is no longer
    (peer, ctx, tag), which the lane builds in C, is refused when the lane is made."""
    import dataclasses

    from aioccl.lanes.pair import pair_setup

    comms = await make_comms(2)
    try:
        c = comms[0]
        setup = pair_setup(c._engine, c._view, lambda *a: None)
        assert native.core.PairLane(setup).enabled
        with pytest.raises(TypeError, match="setup.ctx"):
            native.core.PairLane(dataclasses.replace(setup, ctx="not a number"))
        with pytest.raises(ValueError, match="p2p_key"):
            native.core.PairLane(dataclasses.replace(setup, key=lambda peer, ctx, tag: (ctx, peer, tag)))
    finally:
        await close_all(comms)
