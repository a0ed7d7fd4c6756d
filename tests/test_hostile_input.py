"""Hostile input: a fuzzer process hammers the root and a rank's data port while real ranks bootstrap;
the protocol's pure parts are checked with hypothesis.

Everything stays on loopback and every loop is bounded (the fuzzer stops
after a few seconds or 400 connections).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import struct
import subprocess
import sys

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import aioccl
from aioccl.bootstrap import auth
from aioccl.bootstrap.sockio import MAX_JSON
from aioccl.transport.frames import HEADER_SIZE, KIND_NAMES, unpack

from conftest import WORKERS


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


async def test_fuzzed_ports_do_not_stop_real_ranks(caplog):
    caplog.set_level(logging.INFO, logger="aioccl")
    fds_before, rss_before = len(os.listdir("/proc/self/fd")), _rss_kib()
    uid = aioccl.UniqueId.new(host="127.0.0.1")
    first = asyncio.create_task(aioccl.Communicator.create(uid, 0, 2, timeout=60))
    data_port = None
    for _ in range(200):
        m = re.search(r"rank 0: listening for peers on 127\.0\.0\.1:(\d+)", caplog.text)
        if m:
            data_port = int(m.group(1))
            break
        await asyncio.sleep(0.01)
    assert data_port is not None, caplog.text
    fuzzer = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKERS / "fuzzer.py"), "127.0.0.1", str(uid.port), str(data_port), uid.secret.hex(),
        "3", "1234", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    await asyncio.sleep(1.5)  # the fuzzer has the root and rank 0's listener to itself for a while
    second = asyncio.create_task(aioccl.Communicator.create(uid, 1, 2, timeout=60))
    comms = await asyncio.wait_for(asyncio.gather(first, second), 60)
    xs = [np.full(1000, r + 1, np.int64) for r in range(2)]
    await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, xs, strict=True)))
    assert all((x == 3).all() for x in xs)
    out, err = await asyncio.wait_for(fuzzer.communicate(), 60)
    await asyncio.gather(*(c.close() for c in comms))
    report = out.decode()
    assert "FUZZ DONE" in report, err.decode()[-3000:]
    sent = int(re.search(r"connections=(\d+)", report).group(1))
    assert sent >= 10, report
    # the first drops are logged one by one, with the stranger's address; the rest are counted in summaries
    dropped = [r.getMessage() for r in caplog.records if "dropped connection from" in r.getMessage()]
    assert dropped and all("127.0.0.1" in line for line in dropped), dropped
    ports = [re.search(r"127\.0\.0\.1', (\d+)\)", line).group(1) for line in dropped]
    # a connection is (server, client port): the kernel may give the fuzzer one local port for a connection to
    # the root and another to rank 0's port at the same time (a loaded fresh-clone run logged 51200 for both)
    conns = [(line.split(":", 1)[0], port) for line, port in zip(dropped, ports, strict=True)]
    assert len(conns) == len(set(conns)), f"a connection was logged twice: {conns}"
    fuzz_ports = set(re.findall(r"local=(\d+)", report))
    assert set(ports) <= fuzz_ports, "a real rank's connection was dropped"
    assert any(line.startswith("root: dropped") for line in dropped), dropped  # both servers were attacked
    assert any(line.startswith("rank 0: dropped") for line in dropped), dropped
    # past 8 drops at one server the rest are summarised (at its close at the latest), naming their source; how many
    # connections the fuzzer gets in depends on the machine's load (a loaded run saw 5 and 3), so none may come:
    # test_flood.py holds the one-by-one-then-summary rule itself, deterministically
    summaries = [r.getMessage() for r in caplog.records if " more connections in " in r.getMessage()]
    assert all("from 127.0.0.1 (" in line for line in summaries), summaries
    for who in ("root", "rank 0"):
        one_by_one = [line for line in dropped if line.startswith(f"{who}: dropped")]
        assert len(one_by_one) <= 8, one_by_one  # never more lines than the rule allows
    # bounded: nothing kept per stranger
    assert _rss_kib() - rss_before < 64 * 1024
    await asyncio.sleep(0.2)
    assert len(os.listdir("/proc/self/fd")) <= fds_before + 2


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=HEADER_SIZE, max_size=HEADER_SIZE))
def test_any_48_bytes_decode_to_a_header_or_a_value_error(raw):
    try:
        h = unpack(raw)
    except ValueError:
        return
    assert h.kind in KIND_NAMES and h.nbytes >= 0


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=120), st.binary(min_size=16, max_size=16))
def test_handshake_accepts_only_a_correct_mac(reply, secret):
    nonce_s, _ = auth.challenge()
    try:
        auth.verify_answer(secret, nonce_s, reply)
    except auth.AuthError:
        return
    raise AssertionError("random bytes passed the handshake")


@settings(max_examples=100, deadline=None)
@given(st.binary(min_size=16, max_size=16), st.binary(min_size=16, max_size=16))
def test_a_replayed_answer_fails_against_a_fresh_challenge(secret, other):
    nonce_1, msg_1 = auth.challenge()
    _, reply = auth.answer(secret, msg_1)
    auth.verify_answer(secret, nonce_1, reply)  # the genuine exchange passes
    nonce_2, _ = auth.challenge()
    for key in (secret, other):
        try:
            auth.verify_answer(key, nonce_2, reply)
        except auth.AuthError:
            continue
        raise AssertionError("a recorded answer was accepted for a new challenge")


async def test_oversized_bootstrap_message_is_refused_before_allocation():
    a, b = __import__("socket").socketpair()
    try:
        a.setblocking(False)
        b.sendall(struct.pack("<I", MAX_JSON + 1))
        from aioccl.bootstrap.sockio import recv_json

        try:
            await asyncio.wait_for(recv_json(a), 5)
        except ValueError as e:
            assert "too large" in str(e)
        else:
            raise AssertionError("an oversized message was read")
    finally:
        a.close()
        b.close()
