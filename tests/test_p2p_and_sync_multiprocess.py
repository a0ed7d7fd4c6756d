"""Point-to-point with tags and out-of-order posting, groups and the sync API, in real processes."""

from __future__ import annotations

import pytest

from conftest import launch


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_p2p_sync(n):
    proc = launch(n, "p2p_sync.py")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count(", 0 failures") == n, proc.stdout[-2000:]
