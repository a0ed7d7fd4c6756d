"""Failures reach every rank at once, with the root cause; the launcher names the rank that failed first.

Real processes under ``aioccl-run --keep-going`` (so the survivors can report), over sockets and over
shared memory. The times asserted are generous bounds for a loaded 2-core machine: what they rule out is
a wait for the deadline (120 s in these scenarios).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest

from conftest import ROOT, TRANSPORT_ENV, WORKERS

FAST = 5.0  # seconds: far below every deadline of the scenarios


def run(scenario: str, transport: str, n: int = 3, *launcher: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **TRANSPORT_ENV[transport]}
    return subprocess.run([sys.executable, "-m", "aioccl.run", *launcher, "--nproc-per-node", str(n),
                           str(WORKERS / "promises.py"), scenario], env=env, capture_output=True, text=True,
                          timeout=180)


def results(proc: subprocess.CompletedProcess[str]) -> dict[int, tuple[str, str, float, str]]:
    found = {}
    for m in re.finditer(r"RESULT (\d+) (\w+) (\S*) ([\d.]+) :: (.*)", proc.stdout):
        found[int(m.group(1))] = (m.group(2), m.group(3), float(m.group(4)), m.group(5))
    return found


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_killed_rank_fails_every_survivor_at_once_naming_it(transport):
    proc = run("killed_rank", transport, 3, "--keep-going")
    got = results(proc)
    assert set(got) == {0, 1}, proc.stdout + proc.stderr
    for rank, (kind, culprit, seconds, _msg) in got.items():
        assert kind == "PeerLost" and culprit == "2", (rank, got[rank])
        assert seconds < FAST, got
    # --keep-going: the survivors shrink and carry on; the launcher still names the failure
    assert "SHRUNK 0 -> 0/2 sum 3" in proc.stdout and "SHRUNK 1 -> 1/2 sum 3" in proc.stdout, proc.stdout
    assert "first failure: rank 2 was killed by SIGKILL" in proc.stderr
    assert proc.returncode != 0


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_different_roots_are_a_mismatch_on_every_rank(transport):
    proc = run("different_roots", transport)
    got = results(proc)
    assert set(got) == {0, 1, 2}, proc.stdout + proc.stderr
    for rank, (kind, _c, seconds, msg) in got.items():
        assert kind == "CollectiveMismatch" and "root" in msg, (rank, got[rank])
        assert seconds < FAST
    assert proc.returncode == 0, proc.stderr  # and the communicator stayed usable (a barrier after)


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_mismatch_inside_async_with_is_a_mismatch_everywhere(transport):
    got = results(run("mismatch_async_with", transport))
    assert {r: v[0] for r, v in got.items()} == {0: "CollectiveMismatch", 1: "CollectiveMismatch",
                                                  2: "CollectiveMismatch"}, got


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_one_ranks_timeout_reaches_the_others_at_once(transport):
    got = results(run("one_rank_times_out", transport))
    kind0, _c, t0, _m = got[0]
    assert kind0 == "CollectiveTimeout" and 0.9 < t0 < FAST, got
    kind1, _c, t1, msg1 = got[1]  # its own deadline is 120 s
    assert kind1 == "CollectiveTimeout" and t1 < FAST and "reported by rank 0" in msg1, got
    if 2 in got and got[2][0] != "none":  # the late rank (over sockets) fails at once when it gets there
        assert got[2][0] == "CollectiveTimeout" and got[2][2] < 1.0, got


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_group_op_and_direct_op_from_two_tasks(transport):
    proc = run("group_and_direct", transport)
    assert proc.returncode == 0, proc.stderr
    assert sorted(re.findall(r"GROUP (\d) ok transport=(\w+)", proc.stdout)) == \
        [(str(r), transport) for r in range(3)], proc.stdout + proc.stderr


def test_launcher_names_the_rank_that_raised_first():
    for _ in range(3):  # it used to name whichever rank exited first
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run([sys.executable, "-m", "aioccl.run", "--nproc-per-node", "3",
                               str(WORKERS / "raise_late.py")], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1, proc.stderr
        assert "first failure: rank 2 exited with code 1: ValueError: boom at rank 2" in proc.stderr, proc.stderr


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_watchdog_names_a_deadlock_long_before_the_deadline(transport, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **TRANSPORT_ENV[transport], "AIOCCL_WATCHDOG_S": "0.5",
           "AIOCCL_HANG_DUMP": str(tmp_path / "dump")}
    proc = subprocess.run([sys.executable, "-m", "aioccl.run", "--nproc-per-node", "2",
                           str(WORKERS / "promises.py"), "both_receive_first"], env=env, capture_output=True,
                          text=True, timeout=120)
    for rank in (0, 1):
        peer = 1 - rank
        lines = [ln for ln in proc.stderr.splitlines()
                 if ln.startswith(f"[rank {rank}]") and f"recv(peer={peer}, tag=9) seq 9" in ln and "has waited" in ln]
        assert lines and f"waiting for ranks [{peer}]" in lines[0], proc.stderr
        assert f"rank {rank} on {socket.gethostname()}: recv" in lines[0], lines[0]  # no prefix needed
        assert 2 <= len(lines) <= 6, lines  # once per interval, not per tick
        # the hang dump: written once, when the op is first logged, with what the line cannot hold
        dumps = list((tmp_path / "dump").glob(f"rank{rank}-pid*.txt"))
        assert len(dumps) == 1, list((tmp_path / "dump").iterdir())
        text = dumps[0].read_text()
        assert text.count("== rank") == 1, text
        assert f"recv(peer={peer}, tag=9) seq 9" in text.split("flight recorder")[0], text
        assert "flight recorder (oldest first):" in text and "threads:" in text and "File " in text, text
    got = results(proc)
    # both time out at 2.5 s; the later one may instead see the earlier one close its communicator
    kinds = sorted(v[0] for v in got.values())
    assert kinds in (["CollectiveTimeout", "CollectiveTimeout"], ["CollectiveTimeout", "PeerLost"]), proc.stdout


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_forgotten_await_is_reported_not_dropped(transport):
    proc = run("forgotten_await", transport, 2)
    for rank in (0, 1):
        state = re.search(rf"AT EXIT {rank} (complete|partial)", proc.stdout)
        assert state, proc.stdout + proc.stderr
        warned = re.search(rf"\[rank {rank}\].*RuntimeWarning: all_reduce seq 1 \(4194304 x float32, sum\) (never "
                           r"finished|failed and nobody awaited it)", proc.stderr)
        # the loop's shutdown may have let it finish (then its output is whole); if not, it is said
        assert warned or state.group(1) == "complete", proc.stderr


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_peer_that_closed_after_its_part_dooms_nothing(transport):
    got = results(run("closed_after_its_part", transport))
    assert {r: v[0] for r, v in got.items()} == {0: "complete", 1: "complete", 2: "complete"}, got


def test_settings_that_must_agree_are_compared_at_creation():
    got = results(run("diverging_knobs", "tcp"))
    assert set(got) == {0, 1, 2}, got
    for kind, _c, seconds, msg in got.values():
        assert kind == "InvalidArgument" and seconds < FAST, got
        assert "AIOCCL_BUFFSIZE differs across ranks: ranks [0, 2] have 4194304; ranks [1] have 65536" in msg, msg


@pytest.mark.parametrize(("name", "value"), [("AIOCCL_ALGO", "bogus"), ("AIOCCL_ALGO", "all_reduce:chain"),
                                             ("AIOCCL_ALGO", "allreduce:ring"), ("AIOCCL_WATCHDOG_S", "soon"),
                                             ("AIOCCL_BUFFSIZE", "12"), ("AIOCCL_SHM_SPIN_US", "nan")])
def test_a_bad_knob_is_refused_before_anything_is_sent_and_flagged_by_info(name, value):
    env = {**os.environ, "PYTHONPATH": str(ROOT), name: value}
    code = ("import asyncio, aioccl\n"
            "try:\n"
            "    asyncio.run(aioccl.Communicator.create('127.0.0.1:9/' + '0' * 32, 0, 2))\n"
            "except aioccl.InvalidArgument as e:\n"
            "    print('REFUSED', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert "REFUSED" in proc.stdout and name in proc.stdout, proc.stdout + proc.stderr
    info = subprocess.run([sys.executable, "-m", "aioccl.tools.info", "--json"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert name in info.stdout and value in info.stdout


def test_info_into_a_closed_pipe_ends_without_a_traceback():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(f"{sys.executable} -m aioccl.tools.info --json | head -n 2", shell=True, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.count("\n") == 2 and "Traceback" not in proc.stderr and "Error" not in proc.stderr, proc.stderr


def test_torchrun_spellings_and_variables(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = ("import os; print('ENV', *(os.environ[k] for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', "
            "'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', 'AIOCCL_COMM_ID')))")
    script = tmp_path / "print_env.py"
    script.write_text(code + "\n")
    proc = subprocess.run([sys.executable, "-m", "aioccl.run", "--standalone", "--nproc_per_node", "2",
                           "--rdzv-backend", "c10d", "--rdzv_endpoint", "127.0.0.1:29533", str(script)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = sorted(ln.split(" ENV ", 1)[1] for ln in proc.stdout.splitlines() if " ENV " in ln)
    assert lines == [f"{r} 2 {r} 2 127.0.0.1 29533 127.0.0.1:29534" for r in range(2)], proc.stdout
    auto = subprocess.run([sys.executable, "-m", "aioccl.run", "--nproc-per-node", "auto", "-m", "json.tool",
                           "--help"], env={**env, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True,
                          timeout=60)
    assert auto.returncode == 0 and auto.stdout.count("usage:") == len(os.sched_getaffinity(0)), auto.stderr


@pytest.mark.parametrize("secret", ["abc", "zz" * 16, "ab" * 15])
def test_launcher_refuses_a_secret_the_ranks_would_refuse(secret):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "aioccl.run", "--nproc-per-node", "2", "--secret", secret,
                           str(WORKERS / "echo_env.py")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "32 hex digits" in proc.stderr and "rank=" not in proc.stdout, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "aioccl.run", "--nproc-per-node", "2", str(WORKERS / "echo_env.py")],
                          env={**env, "AIOCCL_COMM_SECRET": secret}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "AIOCCL_COMM_SECRET" in proc.stderr, proc.stderr
