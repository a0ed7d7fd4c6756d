"""Shared fixtures: run workers under the real launcher, or form n communicators in one loop."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

import aioccl

ROOT = Path(__file__).resolve().parent.parent
WORKERS = Path(__file__).resolve().parent / "workers"


def launch(n: int, script: str, *args: str, env: dict[str, str] | None = None,
           timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``aioccl-run --nproc-per-node n tests/workers/<script>`` with real processes and sockets."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "aioccl.run", "--nproc-per-node", str(n),
                           str(WORKERS / script), *args], env=full_env, capture_output=True, text=True,
                          timeout=timeout)


async def make_comms(n: int, engine: str = "inline", timeout: float = 20) -> list[aioccl.Communicator]:
    """n communicators in this process and loop, connected over real loopback sockets."""
    uid = aioccl.UniqueId.new(host="127.0.0.1")
    return list(await asyncio.gather(*(aioccl.Communicator.create(uid, r, n, timeout=timeout, engine=engine)
                                       for r in range(n))))


async def close_all(comms: list[aioccl.Communicator]) -> None:
    await asyncio.gather(*(c.close() for c in comms))


@pytest.fixture
async def comms3():
    comms = await make_comms(3)
    yield comms
    await close_all(comms)
