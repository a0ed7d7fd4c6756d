"""A flood at aioccl's listening sockets costs the job nothing; admission's rules, one by one.

The end-to-end check is ``scripts/flood_check.py``: real ranks bootstrap and
compute while ``scripts/flood.py`` floods the world's root, each round's root,
the ranks' acceptors and their doorbells in turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import pytest

from aioccl.bootstrap import admission, auth, mesh
from aioccl.bootstrap.admission import Admission, DropLog
from aioccl.errors import BootstrapError

from conftest import ROOT


@pytest.mark.parametrize("ranks, transport", [(3, "shm"), (4, "tcp")])
def test_real_ranks_bootstrap_and_compute_exactly_under_a_flood_of_every_port(ranks, transport):
    """Over tcp each pair opens 3 streams, so the flooded acceptors admit the stripe sockets too."""
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "flood_check.py"), "--ranks", str(ranks),
                          "--ops", "40", "--transport", transport], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "FLOOD CHECK PASSED" in out.stdout, out.stdout[-3000:] + out.stderr[-5000:]
    for phase in ("world root", "root", "acceptors") + (("bells",) if transport == "shm" else ()):
        line = next(x for x in out.stdout.splitlines() if x.startswith(f"{phase}: "))
        hits = sum(int(v) for k, v in (kv.split("=") for kv in line.split() if "=" in kv) if "failed" not in k
                   and "refused" not in k)
        assert hits >= 20, f"the flood barely reached the {phase}: {line}"


async def _sleeper() -> None:
    await asyncio.sleep(60)


async def test_a_full_handshake_queue_evicts_its_oldest_stranger_never_a_proven_peer():
    drops = DropLog(logging.getLogger("test.flood"), "root")
    adm = Admission(3, drops)
    tasks = [asyncio.create_task(_sleeper()) for _ in range(6)]
    socks = [socket.socket() for _ in range(6)]
    adm.admit(tasks[0], socks[0], ("10.0.0.1", 1))
    adm.admit(tasks[1], socks[1], ("10.0.0.1", 2))
    adm.proven(tasks[1])  # proved the secret: out of the eviction queue
    adm.admit(tasks[2], socks[2], ("10.0.0.1", 3))
    adm.admit(tasks[3], socks[3], ("10.0.0.1", 4))
    adm.admit(tasks[4], socks[4], ("10.0.0.1", 5))  # the unproven queue (0, 2, 3) is full: 0 goes
    for _ in range(3):  # the cancellation, then the done callbacks
        await asyncio.sleep(0)
    assert tasks[0].cancelled() and not tasks[1].done() and not tasks[2].done()
    assert socks[0].fileno() == -1  # evicted before it ever ran: its socket closed all the same
    adm.admit(tasks[5], socks[5], ("10.0.0.1", 6))  # then 2
    for _ in range(3):  # the cancellation, then the done callbacks
        await asyncio.sleep(0)
    assert tasks[2].cancelled() and not tasks[1].done() and not tasks[3].done()
    assert adm.evicted == 2 and drops.total == 2 and len(adm) == 4
    adm.cancel_all()
    for _ in range(3):
        await asyncio.sleep(0)
    assert all(t.done() for t in tasks) and len(adm) == 0
    assert all(s.fileno() == -1 for s in socks)


def test_drops_are_logged_one_by_one_then_summarised_with_counts(caplog, monkeypatch):
    caplog.set_level(logging.WARNING, logger="test.flood")
    clock = [100.0]
    monkeypatch.setattr(admission.time, "monotonic", lambda: clock[0])
    drops = DropLog(logging.getLogger("test.flood"), "rank 2")
    for i in range(1000):
        drops.drop(("127.0.0.1", 40000 + i), "not aioccl" if i % 2 else "too slow")
        clock[0] += 0.001
    clock[0] += admission.SUMMARY_S
    drops.drop(("10.1.1.1", 5), "closed")
    lines = [r.getMessage() for r in caplog.records]
    singles = [x for x in lines if "dropped connection from" in x]
    assert len(singles) == admission.LOGGED_ONE_BY_ONE and "('127.0.0.1', 40000)" in singles[0]
    summary = [x for x in lines if " more connections in " in x]
    assert len(summary) == 1, lines
    assert "dropped 993 more" in summary[0] and "not aioccl 496" in summary[0] and "too slow 496" in summary[0]
    assert "127.0.0.1 (992x)" in summary[0] and "1001 in all" in summary[0], summary[0]
    assert len(lines) <= admission.LOGGED_ONE_BY_ONE + 2  # 1001 drops, a bounded log


@contextlib.asynccontextmanager
async def _serve(handler) -> AsyncIterator[int]:
    """A loopback listener whose every connection goes to ``handler(conn, n)``; yields its port."""
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(16)
    lst.setblocking(False)
    loop = asyncio.get_running_loop()

    async def accept() -> None:
        n = 0
        while True:
            conn, _ = await loop.sock_accept(lst)
            n += 1
            loop.create_task(handler(conn, n))

    acc = loop.create_task(accept())
    try:
        yield lst.getsockname()[1]
    finally:
        acc.cancel()
        lst.close()


async def test_a_rank_evicted_mid_handshake_dials_again_and_gets_in():
    secret = b"s" * 16
    got: list[dict] = []

    async def evict_twice_then_serve(conn: socket.socket, n: int) -> None:
        from aioccl.bootstrap.sockio import recv_json

        conn.setblocking(False)
        try:
            if n <= 2:  # a flooded server drops the first two tries
                await asyncio.get_running_loop().sock_sendall(conn, auth.MAGIC + b"x" * 4)
                return
            await auth.as_server(conn, secret, timeout=5)
            got.append(await recv_json(conn))
        finally:
            conn.close()

    async with _serve(evict_twice_then_serve) as port:
        sock = await mesh._meet("127.0.0.1", port, secret, time.monotonic() + 10, "rank 3",
                                      {"rank": 1, "comm_id": 5}, rank=1)
        sock.close()
        for _ in range(100):
            if got:
                break
            await asyncio.sleep(0.01)
        assert got == [{"rank": 1, "comm_id": 5}]


async def test_a_port_held_by_another_program_fails_at_once_naming_it():
    async def http(conn: socket.socket, n: int) -> None:
        conn.setblocking(False)
        await asyncio.get_running_loop().sock_sendall(conn, b"HTTP/1.1 400 Bad Request\r\n\r\n")
        conn.close()

    async with _serve(http) as port:
        t0 = time.monotonic()
        with pytest.raises(BootstrapError, match=f"the root at 127.0.0.1:{port}: server did not speak the aioccl "
                                                 "handshake: something else listens on that port"):
            await mesh._meet("127.0.0.1", port, b"s" * 16, time.monotonic() + 30, "the root", {}, rank=2)
        assert time.monotonic() - t0 < 2


async def test_a_silent_listener_is_tried_until_the_deadline_and_named(monkeypatch):
    monkeypatch.setattr(mesh, "ATTEMPT_S", 0.3)
    held: list[socket.socket] = []

    async def silent(conn: socket.socket, n: int) -> None:
        held.append(conn)

    try:
        async with _serve(silent) as port:
            t0 = time.monotonic()
            with pytest.raises(BootstrapError, match=f"no handshake with the root at 127.0.0.1:{port} before the "
                                                     "deadline in [2-9] tries.*never sent aioccl's challenge"):
                await mesh._meet("127.0.0.1", port, b"s" * 16, time.monotonic() + 1.5, "the root", {}, rank=2)
            assert time.monotonic() - t0 < 3
            assert len(held) >= 2
    finally:
        for c in held:
            c.close()
