"""Soak: 4 ranks, 10,000 random ops (every kind, dtype, size class, root), every element checked;
memory and file descriptors stay flat, the scratch pool bounded."""

from __future__ import annotations

import re

from conftest import launch


def test_ten_thousand_mixed_ops_on_four_ranks():
    p = launch(4, "soak.py", "10000", timeout=400)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    lines = [ln for ln in p.stdout.splitlines() if "SOAK rank" in ln]
    assert len(lines) == 4, p.stdout[-3000:]
    for ln in lines:
        print(ln[:220])
        assert "10000 ops" in ln and "wrong 0" in ln and "pending 0" in ln and "p2p queues 0" in ln
        before, after = map(int, re.search(r"fds (\d+)->(\d+)", ln).groups())
        assert before == after
