"""The full collective matrix, in real processes through aioccl-run, for 1..5 ranks."""

from __future__ import annotations

import pytest

from conftest import launch

SETTINGS = {
    # sockets only: 64 float32 per chunk, so large sizes run many pipelined pieces
    "tcp-latency": {"AIOCCL_SHM_DISABLE": "1", "AIOCCL_BUFFSIZE": "256", "AIOCCL_ALGO": "rd,tree"},
    "tcp-bandwidth": {"AIOCCL_SHM_DISABLE": "1", "AIOCCL_BUFFSIZE": "256", "AIOCCL_ALGO": "ring,chain"},
    # shared memory with 4 KiB slot halves, so 1000 doubles and every block-wise op run in chunks
    "shm-flat": {"AIOCCL_SHM_BUFFSIZE": "4096", "AIOCCL_ALGO": "flat", "EXPECT_TRANSPORT": "shm"},
    "shm-direct": {"AIOCCL_SHM_BUFFSIZE": "4096", "AIOCCL_ALGO": "direct", "EXPECT_TRANSPORT": "shm"},
    # the same two with the native core switched off: its small ops then take the Python executor (both ways
    # meet the same checks); the default settings, which pick per size, both ways too
    "shm-flat-python": {"AIOCCL_SHM_BUFFSIZE": "4096", "AIOCCL_ALGO": "flat", "EXPECT_TRANSPORT": "shm",
                        "AIOCCL_NATIVE": "0"},
    "shm-direct-python": {"AIOCCL_SHM_BUFFSIZE": "4096", "AIOCCL_ALGO": "direct", "EXPECT_TRANSPORT": "shm",
                          "AIOCCL_NATIVE": "0"},
    "shm-default": {"EXPECT_TRANSPORT": "shm"},
    "shm-default-python": {"EXPECT_TRANSPORT": "shm", "AIOCCL_NATIVE": "0"},
    # ranks on two "hosts" (AIOCCL_HOSTID = rank % 2: 1+1, 2+1, 2+2, 3+2 ranks): hierarchical schedules over
    # shared-memory pairs inside a host and sockets across; 64 float32 per chunk, so 1000 elements run the
    # bandwidth phases and the small sizes the latency ones
    "hosts-rail": {"HOSTS": "interleaved", "AIOCCL_BUFFSIZE": "256",
                   "AIOCCL_ALGO": "all_reduce:rail,all_gather:rail,reduce_scatter:rail,reduce:leader,broadcast:leader"},
    "hosts-leader": {"HOSTS": "interleaved", "AIOCCL_BUFFSIZE": "256", "AIOCCL_ALGO": "leader"},
}


# 5 ranks for the two-host layouts only (3 + 2): elsewhere 3 ranks already cover an odd count that is not a
# power of two, and 5 processes on this 2-core machine cost the suite half a minute
@pytest.mark.parametrize(("setting", "n"), [(s, n) for s in SETTINGS for n in (1, 2, 3, 4, 5)
                                            if n < 5 or s.startswith("hosts")])
def test_matrix(n, setting):
    if n == 1 and setting.startswith(("shm", "hosts")):
        pytest.skip("one rank has no peers to share memory with or hosts to span (it runs the n=1 shortcuts)")
    env = dict(SETTINGS[setting])
    # every dtype at 3 ranks (and at 1, the shortcuts); one dtype of each kind at 2, 4 and 5 (issue 75's fold:
    # a dtype's bytes take the same schedule at every size, so each algorithm x dtype is still run, at 3 ranks,
    # and each algorithm x size at five dtypes; the reductions of every dtype are also in test_native.py)
    if n not in (1, 3):
        env["MATRIX_DTYPES"] = "few"
    if setting.startswith("tcp"):
        env["EXPECT_TRANSPORT"] = "tcp"
    proc = launch(n, "collectives.py", env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if " checks, " in ln]
    assert len(lines) == n, proc.stdout[-2000:]
    assert all(ln.endswith(", 0 failures") for ln in lines), lines
