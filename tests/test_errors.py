"""Bad input fails before any byte moves; failures name the op, its sequence number and the ranks."""

from __future__ import annotations

import asyncio
import re
import socket

import numpy as np
import pytest

import aioccl
from aioccl import InvalidArgument

from conftest import ROOT, close_all, launch, make_comms

BAD_CALLS = {
    "unsupported dtype": lambda c: c.all_reduce(np.zeros(4, np.complex64)),
    "bool dtype": lambda c: c.broadcast(np.zeros(4, bool)),
    "not an array": lambda c: c.all_reduce(object()),
    "None input": lambda c: c.all_reduce(None),
    "out shape": lambda c: c.all_reduce(np.zeros(4, np.float32), out=np.zeros(5, np.float32)),
    "out dtype": lambda c: c.all_reduce(np.zeros(4, np.float32), out=np.zeros(4, np.float64)),
    "non-contiguous": lambda c: c.all_reduce(np.zeros(8, np.float32)[::2]),
    "non-contiguous out": lambda c: c.all_gather(np.zeros(2), out=np.zeros((4, 2))[:, 0]),
    "read-only in place": lambda c: c.all_reduce(_readonly(4)),
    "read-only out": lambda c: c.all_reduce(np.zeros(4), out=_readonly(4)),
    "read-only recv": lambda c: c.irecv(_readonly(4), 1),
    "root too big": lambda c: c.broadcast(np.zeros(4), root=3),
    "root negative": lambda c: c.reduce(np.zeros(4), root=-1),
    "root not int": lambda c: c.gather(np.zeros(4), root="0"),
    "peer too big": lambda c: c.isend(np.zeros(4), 5),
    "peer negative": lambda c: c.irecv(np.zeros(4), -2),  # (-1 is ANY_SOURCE, for a receive)
    "send to any source": lambda c: c.isend(np.zeros(4), -1),
    "bad tag": lambda c: c.isend(np.zeros(4), 1, tag=-3),
    "avg on ints": lambda c: c.all_reduce(np.zeros(4, np.int32), op="avg"),
    "unknown op": lambda c: c.all_reduce(np.zeros(4), op="xor"),
    "reduce_scatter not divisible": lambda c: c.reduce_scatter(np.zeros(4)),
    "reduce_scatter 0-d": lambda c: c.reduce_scatter(np.zeros(())),
    "all_to_all not divisible": lambda c: c.all_to_all(np.zeros(5)),
    "all_gather out shape": lambda c: c.all_gather(np.zeros(3), out=np.zeros(5)),
    "scatter without out off-root": lambda c: c.scatter(None, root=1),
    "overlapping out": lambda c: (lambda b: c.all_reduce(b[:4], out=b[2:6]))(np.zeros(8)),
    "non-positive timeout": lambda c: c.barrier(timeout=0),
    "split color": lambda c: c.split(-2),
}


def _readonly(n: int) -> np.ndarray:
    a = np.zeros(n)
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
async def test_bad_input_raises_before_sending_and_comm_stays_usable(comms3, case):
    with pytest.raises(InvalidArgument):
        BAD_CALLS[case](comms3[0])
    # nothing was sent and no sequence number was taken: the next collective still matches
    xs = [np.full(6, c.rank, np.int64) for c in comms3]
    await asyncio.wait_for(asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms3, xs, strict=True))), 10)
    assert all((x == 3).all() for x in xs)


async def test_invalid_argument_is_a_value_error():
    assert issubclass(InvalidArgument, ValueError) and issubclass(aioccl.CollectiveTimeout, TimeoutError)
    with pytest.raises(InvalidArgument):
        await aioccl.Communicator.create(aioccl.UniqueId.new(host="127.0.0.1"), rank=2, world_size=2)


async def test_timeout_names_op_seq_and_silent_rank(comms3):
    a, b, _late = comms3
    wa, wb = a.all_reduce(np.ones(4), timeout=0.5), b.all_reduce(np.ones(4), timeout=0.5)
    with pytest.raises(aioccl.CollectiveTimeout) as info:
        await wb
    err = info.value
    assert err.op == "all_reduce" and err.seq == 0 and err.waiting_for == [2]
    assert err.comm == f"{b._view.ctx:x}" and f"all_reduce (seq 0, comm {err.comm})" in str(err)
    assert "[2]" in str(err)
    # the flight recorder rides along: earlier ops, and this one
    assert any("all_reduce seq 0 (4 x float64, sum): CollectiveTimeout" in line for line in err.recent), err.recent
    assert "recent ops on this rank" in str(err)
    with pytest.raises(aioccl.CollectiveTimeout):
        await wa


async def test_recv_timeout_names_peer(comms3):
    with pytest.raises(aioccl.CollectiveTimeout, match=r"recv\(peer=2, tag=4\).*\[2\]"):
        await comms3[0].irecv(np.zeros(2), 2, tag=4, timeout=0.3)


MISMATCHES = {  # (what ranks 0 and 1 call, what rank 2 calls, words each error must contain)
    "count": (lambda c: c.all_reduce(np.ones(4, np.float32)), lambda c: c.all_reduce(np.ones(5, np.float32)),
              ["of 4 x float32", "of 5 x float32"]),
    "dtype": (lambda c: c.all_reduce(np.ones(4, np.float32)), lambda c: c.all_reduce(np.ones(4, np.int32)),
              ["float32", "int32"]),
    "reduction": (lambda c: c.all_reduce(np.ones(4), op="sum"), lambda c: c.all_reduce(np.ones(4), op="max"),
                  ["sum", "max"]),
    "kind": (lambda c: c.all_reduce(np.ones(6)), lambda c: c.broadcast(np.ones(6)), ["all_reduce", "broadcast"]),
    "root": (lambda c: c.broadcast(np.ones(4), root=0), lambda c: c.broadcast(np.ones(4), root=2),
             ["root 0", "root 2"]),
    "reduce root": (lambda c: c.reduce(np.ones(4), root=1), lambda c: c.reduce(np.ones(4), root=0),
                    ["root 1", "root 0"]),
}


@pytest.mark.parametrize("transport", ["tcp", "shm", "ib"])
@pytest.mark.parametrize("case", sorted(MISMATCHES))
async def test_mismatch_fails_every_rank_naming_both_calls(transport, case, caplog):
    same, odd, words = MISMATCHES[case]
    comms = await make_comms(3, transport=transport, timeout=30)
    try:
        t0 = asyncio.get_running_loop().time()
        r = await asyncio.gather(same(comms[0]), same(comms[1]), odd(comms[2]), return_exceptions=True)
        took = asyncio.get_running_loop().time() - t0
        assert took < 5, f"detected after {took:.1f}s: not from the first frame"  # the deadline is 30 s
        # a rank whose part was send-only may finish before a mismatched frame reaches it (rooted ops);
        # every rank that would consume the wrong data raises
        raised = [e for e in r if isinstance(e, BaseException)]
        assert all(isinstance(e, aioccl.CollectiveMismatch) for e in raised), r
        if case in ("root", "reduce root") and transport in ("tcp", "ib"):  # frame transports
            logged: list[str] = []
            for _ in range(50):  # the late frame or notice may land just after the ops returned
                logged = [rec.getMessage() for rec in caplog.records if "collective mismatch" in rec.getMessage()]
                if raised or logged:
                    break
                await asyncio.sleep(0.05)
            assert raised or logged, (r, caplog.text)
            raised += [aioccl.CollectiveMismatch(m, 0, (2,), ("a", "b")) for m in logged]
        else:
            assert len(raised) == 3, r
        for e in raised:
            assert e.seq == 0 and 2 in e.ranks and len(e.calls) == 2, (e, e.ranks)
            assert all(w in str(e) for w in words), str(e)
            assert "rank 2 issued" in str(e) or "rank 2" in str(e).split("issued")[-2], str(e)
        # the sequence number was consumed everywhere: the next collective matches and is exact
        xs = [np.full(7, c.rank + 1, np.int64) for c in comms]
        await asyncio.wait_for(asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, xs, strict=True))), 10)
        assert all((x == 6).all() for x in xs)
    finally:
        for c in comms:
            c.abort()


@pytest.mark.parametrize("transport", ["tcp", "shm", "ib"])
async def test_abort_fails_peers_with_peer_lost(transport):
    comms = await make_comms(3, transport=transport)
    # a broadcast from rank 0 reaches ranks 1 and 2 directly (binomial tree): both need rank 0
    pending = [comms[1].broadcast(np.ones(100), root=0, timeout=30),
               comms[2].broadcast(np.ones(100), root=0, timeout=30)]
    await asyncio.sleep(0.05)
    comms[0].abort()
    for w in pending:
        with pytest.raises(aioccl.PeerLost) as info:
            await asyncio.wait_for(w, 10)
        assert info.value.rank == 0
    with pytest.raises(aioccl.CommAborted):
        comms[0].barrier()
    with pytest.raises(aioccl.PeerLost):
        await asyncio.wait_for(comms[1].isend(np.ones(2), 0), 10)
    await close_all(comms[1:])


async def test_root_survives_garbage_and_strangers():
    uid = aioccl.UniqueId.new(host="127.0.0.1")
    with socket.create_connection((uid.host, uid.port)) as s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n" * 10)
    stranger = aioccl.UniqueId(uid.host, uid.port, bytes(16))
    with pytest.raises(aioccl.BootstrapError):
        await aioccl.Communicator.create(stranger, 0, 2, timeout=2)
    comms = await asyncio.gather(*(aioccl.Communicator.create(uid, r, 2, timeout=10) for r in range(2)))
    xs = [np.ones(3) for _ in comms]
    await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, xs, strict=True)))
    assert all((x == 2).all() for x in xs)
    await close_all(list(comms))


async def test_missing_rank_fails_bootstrap_with_deadline():
    uid = aioccl.UniqueId.new(host="127.0.0.1")
    with pytest.raises(aioccl.BootstrapError):
        await aioccl.Communicator.create(uid, 0, 2, timeout=1)


def test_crashed_process_gives_peer_lost_not_a_hang():
    proc = launch(3, "crash.py", timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.count("PeerLost rank=1") == 2, proc.stdout


class _OnGpu:
    """Looks like a cupy / torch CUDA array to the library (no GPU is touched)."""

    __cuda_array_interface__ = {"shape": (6,), "typestr": "<f4", "data": (0, False), "version": 3}


class _DLPackOnGpu:
    def __dlpack__(self, stream=None):  # pragma: no cover - never called: the device is checked first
        raise AssertionError("read a device buffer")

    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA


def _bad_inputs() -> dict[str, tuple[object, str]]:
    ro = np.zeros(6, np.float32)
    ro.flags.writeable = False
    return {
        "complex dtype": (np.zeros(6, np.complex64), "dtype"),
        "object dtype": (np.array([None] * 6), "dtype"),
        "non-contiguous": (np.zeros(12, np.float32)[::2], "C-contiguous"),
        "not an array": (object(), "expected a numpy"),
        "None": (None, "is None"),
        "cuda array": (_OnGpu(), "GPU memory"),
        "dlpack on a gpu": (_DLPackOnGpu(), "GPU memory"),
        "read-only": (ro, "read-only"),
    }


# op -> call with the data argument; read-only only matters where the op writes its input
EVERY_OP = {
    "all_reduce": (lambda c, x: c.all_reduce(x), True),
    "broadcast": (lambda c, x: c.broadcast(x, root=1), True),
    "reduce": (lambda c, x: c.reduce(x, root=0), True),
    "all_gather": (lambda c, x: c.all_gather(x), False),
    "reduce_scatter": (lambda c, x: c.reduce_scatter(x), False),
    "gather": (lambda c, x: c.gather(x, root=0), False),
    "scatter": (lambda c, x: c.scatter(x, root=0), False),  # the root keeps its own block where it is
    "all_to_all": (lambda c, x: c.all_to_all(x), True),
    "isend": (lambda c, x: c.isend(x, 1), False),
    "irecv": (lambda c, x: c.irecv(x, 1), True),
}
ARG_CASES = {
    **{f"{op} root {root!r}": (lambda c, op=op, root=root: getattr(c, op)(np.zeros(6, np.float32), root=root),
                               "root")
       for op in ("broadcast", "reduce", "gather", "scatter") for root in (3, -1, "0", 1.5, None)},
    **{f"{op} peer {peer!r}": (lambda c, op=op, peer=peer: getattr(c, op)(np.zeros(6, np.float32), peer), "peer")
       for op in ("isend", "irecv") for peer in (3, -2, "1", None)},
    "isend peer ANY_SOURCE": (lambda c: c.isend(np.zeros(6, np.float32), -1), "peer"),
    "isend tag ANY_TAG": (lambda c: c.isend(np.zeros(6, np.float32), 1, tag=-1), "tag"),
    **{f"{op} tag {tag!r}": (lambda c, op=op, tag=tag: getattr(c, op)(np.zeros(6, np.float32), 1, tag=tag), "tag")
       for op in ("isend", "irecv") for tag in (-2, 2**62, "a", 1.0)},
    **{f"{op} {rop} on {dt}": (lambda c, op=op, rop=rop, dt=dt: getattr(c, op)(np.zeros(6, dt), op=rop), msg)
       for op in ("all_reduce", "reduce", "reduce_scatter")
       for rop, dt, msg in (("avg", np.int32, "avg"), ("xor", np.float32, "xor"), (7, np.float32, "op"))},
    **{f"{op} out {what}": (lambda c, op=op, out=out: getattr(c, op)(np.zeros(6, np.float32), out=out), msg)
       for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
       for what, out, msg in (("dtype", np.zeros(6, np.float64), "dtype"), ("shape", np.zeros(5, np.float32),
                                                                              "shape"),
                              ("empty", np.zeros(6, np.float32)[:0], "shape"))},
    "reduce_scatter uneven": (lambda c: c.reduce_scatter(np.zeros(7, np.float32)), "multiple of the 3 ranks"),
    "all_to_all uneven": (lambda c: c.all_to_all(np.zeros(7, np.float32)), "multiple of the 3 ranks"),
    "scatter off-root without out": (lambda c: c.scatter(None, root=1), "out="),
    "timeout zero": (lambda c: c.all_reduce(np.zeros(6, np.float32), timeout=0), "timeout"),
    "timeout negative": (lambda c: c.isend(np.zeros(6, np.float32), 1, timeout=-1), "timeout"),
}


def _every_invalid_call() -> dict[str, tuple[object, str]]:
    cases: dict[str, tuple[object, str]] = dict(ARG_CASES)
    for op, (call, writes) in EVERY_OP.items():
        for what, (arg, msg) in _bad_inputs().items():
            if what == "read-only" and not writes:
                continue
            cases[f"{op} {what}"] = (lambda c, call=call, arg=arg: call(c, arg), msg)
    return cases


@pytest.mark.parametrize("transport", ["tcp", "shm", "ib"])
async def test_every_invalid_call_on_every_op_is_refused_before_anything_moves(transport):
    comms = await make_comms(3, transport=transport)
    c = comms[0]
    moved: list[str] = []
    real_send = c._engine.send

    async def counting_send(*a):
        moved.append("frame")
        return await real_send(*a)

    c._engine.send = counting_send
    if c._state.shm is not None:
        real_submit = c._state.shm.submit
        c._state.shm.submit = lambda op: (moved.append("shm op"), real_submit(op))[1]
    cases = _every_invalid_call()
    assert len(cases) > 100
    try:
        for name, (call, msg) in cases.items():
            seq = c._seq
            with pytest.raises(InvalidArgument) as info:
                call(c)
            assert re.search(msg, str(info.value)), f"{name}: {info.value}"
            assert c._seq == seq and c.pending() == [] and not moved, name
        # the communicator is in step for the next op on every rank
        xs = [np.full(6, r, np.int64) for r in range(3)]
        await asyncio.wait_for(asyncio.gather(*(k.all_reduce(x) for k, x in zip(comms, xs, strict=True))), 10)
        assert all((x == 3).all() for x in xs) and moved
    finally:
        await close_all(comms)


@pytest.mark.asyncio
@pytest.mark.parametrize("transport", ["shm", "tcp"])
async def test_a_receive_of_the_wrong_size_reads_as_docs_api_says(transport):
    """The receiver's mismatch names what came and what it posted; docs/api.md's example is the real text."""
    doc = " ".join((ROOT / "docs" / "api.md").read_text().split())
    example = re.search(r"\(`(recv\(peer=0, tag=1\): rank 0 sent [^`]*)`\)", doc)
    assert example is not None, "docs/api.md: the example of a receive of the wrong size"
    a, b = comms = await make_comms(2, transport=transport)
    try:
        buf = np.full(4, -1.0)
        sent = a.isend(np.arange(8, dtype=np.float64), 1, tag=1)
        with pytest.raises(aioccl.CollectiveMismatch) as caught:
            await b.irecv(buf, 0, tag=1)
        assert str(caught.value) == example.group(1)
        assert (buf == -1.0).all()  # nothing written
        await sent
        x = np.arange(4, dtype=np.float64)  # and the pair goes on
        await asyncio.gather(a.isend(x, 1, tag=2), b.irecv(buf, 0, tag=2))
        assert (buf == x).all()
    finally:
        await close_all(comms)
