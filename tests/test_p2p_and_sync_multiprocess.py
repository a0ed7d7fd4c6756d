"""Point-to-point with tags and out-of-order posting, groups and the sync API, in real processes."""

from __future__ import annotations

import pytest

from conftest import TRANSPORT_ENV, launch


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_p2p_sync(n):
    proc = launch(n, "p2p_sync.py")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count(", 0 failures") == n, proc.stdout[-2000:]


@pytest.mark.parametrize("spin_us", ["0", "50"])
def test_p2p_sync_over_sockets(spin_us):
    """Over TCP a small send is written from the issuing call and a receive polls its socket first
    (``AIOCCL_NET_SPIN_US``) or waits on the loop at once (0): both paths, every case."""
    proc = launch(3, "p2p_sync.py", env={**TRANSPORT_ENV["tcp"], "AIOCCL_NET_SPIN_US": spin_us})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count(", 0 failures") == 3, proc.stdout[-2000:]


@pytest.mark.parametrize(("n", "transport", "eager"), [(3, "shm", "1048576"), (4, "shm", "4096"), (3, "tcp", "1048576"),
                                                      (3, "tcp", "4096")])
def test_receive_from_any_source(n, transport, eager):
    """Wildcard receives over shared-memory pairs and TCP, eager and by rendezvous (a 64 KiB message over a
    4 KiB eager limit; 2 MiB over the default): per-sender order, posting order, status, deadline, errors."""
    proc = launch(n, "any_source.py", str(1 << 19 if eager == "1048576" else 1 << 14),
                  env={**TRANSPORT_ENV[transport], "AIOCCL_P2P_EAGER": eager})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count(", 0 failures") == n, proc.stdout[-2000:]
