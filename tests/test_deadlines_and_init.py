"""Deadlines are deadlines (every timeout checked the same way), and a cancelled init() leaves nothing behind."""

from __future__ import annotations

import asyncio
import os
import socket
import threading

import numpy as np
import pytest

import aioccl

from conftest import close_all, make_comms

BAD = [float("nan"), float("inf"), -1, 0, "5", True, [1]]


@pytest.mark.parametrize("transport", ["tcp", "shm"])
async def test_every_bad_timeout_is_an_invalid_argument_and_the_comm_stays_usable(transport):
    comms = await make_comms(2, transport=transport)
    try:
        for bad in BAD:
            for call in (lambda c, t=bad: c.all_reduce(np.ones(4), timeout=t),
                         lambda c, t=bad: c.isend(np.ones(4), 1 - c.rank, timeout=t),
                         lambda c, t=bad: c.barrier(timeout=t),
                         lambda c, t=bad: c.close(timeout=t)):
                with pytest.raises(aioccl.InvalidArgument, match="timeout"):
                    call(comms[0])
            if bad != 0:  # wait(0) polls
                with pytest.raises(aioccl.InvalidArgument, match="timeout"):
                    aioccl.Work("x", 0).wait(bad)
        xs = [np.full(4, r + 1.0) for r in range(2)]
        await asyncio.gather(*(c.all_reduce(x, timeout=5) for c, x in zip(comms, xs, strict=True)))
        assert all((x == 3).all() for x in xs)
    finally:
        await close_all(comms)


@pytest.mark.parametrize("value", ["nan", "inf", "abc", "-3", "0"])
async def test_bad_aioccl_timeout_names_the_variable(monkeypatch, value, loopback_port):
    monkeypatch.setenv("AIOCCL_TIMEOUT", value)
    with pytest.raises(aioccl.InvalidArgument, match="AIOCCL_TIMEOUT"):
        await aioccl.Communicator.create(aioccl.UniqueId.parse("127.0.0.1:1/" + "0" * 32), 0, 2)
    monkeypatch.setenv("AIOCCL_RANK", "0")
    monkeypatch.setenv("AIOCCL_WORLD_SIZE", "2")
    monkeypatch.setenv("AIOCCL_COMM_ID", f"127.0.0.1:{loopback_port}")
    with pytest.raises(aioccl.InvalidArgument, match="AIOCCL_TIMEOUT"):
        await aioccl.init()


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _roots(before: frozenset[threading.Thread] = frozenset()) -> list[threading.Thread]:
    """Root servers' threads alive now, but those in ``before`` (another test in this worker may have left a root
    serving until its own deadline)."""
    return [t for t in threading.enumerate() if t.name == "aioccl-root" and t.is_alive() and t not in before]


async def test_cancelled_init_releases_the_root_and_init_can_be_retried(monkeypatch, loopback_port):
    port = loopback_port
    monkeypatch.setenv("AIOCCL_RANK", "0")
    monkeypatch.setenv("AIOCCL_WORLD_SIZE", "2")
    monkeypatch.setenv("AIOCCL_COMM_ID", f"127.0.0.1:{port}")
    monkeypatch.setenv("AIOCCL_COMM_SECRET", "ab" * 16)
    fds, others = _fds(), frozenset(_roots())
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(aioccl.init(timeout=60), 1)  # rank 1 never comes
    assert not _roots(others)  # close() joined its thread before the cancellation went on
    await asyncio.sleep(0.2)
    assert _fds() <= fds + 1, os.listdir("/proc/self/fd")
    probe = socket.socket()
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    probe.bind(("127.0.0.1", port))  # the port is free again
    probe.close()

    async def rank1() -> aioccl.Communicator:
        uid = aioccl.UniqueId.parse(f"127.0.0.1:{port}/{'ab' * 16}")
        await asyncio.sleep(0.3)
        return await aioccl.Communicator.create(uid, 1, 2, timeout=30)

    comms = await asyncio.gather(aioccl.init(timeout=30), rank1())  # the retry in the same process works
    xs = [np.full(3, r + 1) for r in range(2)]
    await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, xs, strict=True)))
    assert all((x == 3).all() for x in xs)
    await close_all(list(comms))
