"""Shared fixtures: run workers under the real launcher, or form n communicators in one loop."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import anyio
import pytest
import pytest_asyncio
from suite_hygiene import _attribute_leftovers, pytest_configure, pytest_sessionfinish  # noqa: F401  (leaves nothing)

import aioccl
from aioccl.bootstrap.ports import Reservation, reserve, reserve_in

ROOT = Path(__file__).resolve().parent.parent


def reserved_port(count: int = 1, lo: int | None = None, hi: int | None = None) -> Reservation:
    """Hold ``count`` consecutive loopback ports (or one in ``[lo, hi)``) for as long as the test uses them:
    a ``with`` around the processes that bind them (``bootstrap/ports.py``; never "find one, close it")."""
    if lo is not None and hi is not None:
        return reserve_in(lo, hi, "127.0.0.1")
    return reserve("127.0.0.1", count=count)


@pytest.fixture
def loopback_port():
    """A loopback port reserved for the whole test (and the next one too: torchrun puts aioccl's root there)."""
    with reserved_port(2) as r:
        yield r.port


# the suite's longest tests (10-35 s each on 2 cores), started first so that xdist's workers do not end with
# one of them running alone; the order of the rest is kept
LONG_FIRST = ("test_sim.py::test_tuner_within", "test_soak.py", "test_bad_network.py", "test_jax_mpi4jax_parity.py",
              "test_torch_suite.py", "test_jax_ext.py::test_mesh", "test_collectives_multiprocess.py::test_matrix",
              "test_kill_stress.py", "test_stripes.py", "test_torch_backend.py", "test_packaging.py", "test_flood.py",
              "test_mismatch_race.py", "test_ray.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def late(item: pytest.Item) -> bool:
        return not any(f"/{long}" in f"/{item.nodeid}" or item.nodeid.startswith(f"tests/{long}")
                       for long in LONG_FIRST)

    items.sort(key=late)  # stable: False (a long test) first


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector, name, obj):
    """pytest-asyncio runs in strict mode so that anyio's plugin owns the tests marked ``anyio`` (run on
    asyncio and trio); every other ``async def test_*`` is marked for pytest-asyncio here, unasked."""
    if inspect.iscoroutinefunction(obj) and collector.funcnamefilter(name):
        marks = _mark_names(obj) | _mark_names(collector.module if isinstance(collector, pytest.Class) else
                                               collector.obj)
        if not marks & {"anyio", "asyncio"}:
            pytest.mark.asyncio(obj)


def _mark_names(obj: object) -> set[str]:
    marks = getattr(obj, "pytestmark", [])
    return {m.name for m in (marks if isinstance(marks, list) else [marks])}
WORKERS = Path(__file__).resolve().parent / "workers"


@contextlib.contextmanager
def own_tmpdir() -> Iterator[dict[str, str]]:
    """``TMPDIR`` for one call of a tool that leaves its temporary folders behind (torchrun keeps its
    ``torchelastic_*`` log folders): a folder of the call's own, removed after it."""
    with tempfile.TemporaryDirectory(prefix="own-") as d:
        yield {"TMPDIR": d}


def shm_segments(pids: tuple[int, ...] | None = None) -> set[str]:
    """aioccl's shared-memory segments (``aioccl-<comm>-<rank>-<pid>``), of the processes ``pids`` only when
    given: tests run side by side (xdist), so a test looks at its own processes' segments, not the machine's."""
    names = {n for n in os.listdir("/dev/shm") if n.startswith("aioccl-")}
    return names if pids is None else {n for n in names if n.rsplit("-", 1)[-1] in {str(p) for p in pids}}


def orphaned_segments(before: set[str]) -> set[str]:
    """Segments made since ``before`` whose process has ended: what a finished job left behind (a live
    process's segment may be another test's, running beside this one)."""
    left = set()
    for name in shm_segments() - before:
        try:
            os.kill(int(name.rsplit("-", 1)[-1]), 0)
        except ProcessLookupError:
            left.add(name)
        except (PermissionError, ValueError):
            pass
    return left


def launch(n: int, script: str, *args: str, env: dict[str, str] | None = None,
           timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``aioccl-run --nproc-per-node n tests/workers/<script>`` with real processes and sockets."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "aioccl.run", "--nproc-per-node", str(n),
                           str(WORKERS / script), *args], env=full_env, capture_output=True, text=True,
                          timeout=timeout)


TRANSPORT_ENV = {
    "shm": {"AIOCCL_SHM_DISABLE": "0", "AIOCCL_NET": "socket"},
    "tcp": {"AIOCCL_SHM_DISABLE": "1", "AIOCCL_NET": "socket"},
    # the ib transport over the in-process loopback backend: a test of its protocol, not of a NIC
    "ib": {"AIOCCL_SHM_DISABLE": "1", "AIOCCL_NET": "ib", "AIOCCL_IB_BACKEND": "loopback"},
}


async def make_comms(n: int, engine: str = "inline", timeout: float = 20,
                     transport: str = "shm") -> list[aioccl.Communicator]:
    """n communicators in this process and loop, over shared memory (the default for one host),
    over real loopback sockets only (``transport="tcp"``), or over the ib transport on its loopback
    verbs backend (``transport="ib"``)."""
    return await _form(n, transport, timeout, engine, asyncio.gather)


async def close_all(comms: list[aioccl.Communicator]) -> None:
    await asyncio.gather(*(c.close() for c in comms))


# -- the same for tests that anyio's plugin runs on asyncio and on trio --------------------------------------
async def gather_any(*aws: Awaitable[Any]) -> list[Any]:
    """``asyncio.gather`` for either library: await each in its own task of one task group."""
    results: list[Any] = [None] * len(aws)

    async def one(i: int, aw: Awaitable[Any]) -> None:
        results[i] = await aw

    async with anyio.create_task_group() as tg:
        for i, aw in enumerate(aws):
            tg.start_soon(one, i, aw)
    return results


async def make_comms_any(n: int, transport: str = "shm", timeout: float = 20,
                         engine: str = "auto") -> list[aioccl.Communicator]:
    """:func:`make_comms` under asyncio or trio (the default placement: inline on asyncio, a proxy thread
    under trio)."""
    return await _form(n, transport, timeout, engine, gather_any)


async def close_all_any(comms: list[aioccl.Communicator]) -> None:
    await gather_any(*(c.close() for c in comms))


async def _form(n: int, transport: str, timeout: float, engine: str,
                gather: Callable[..., Awaitable[Any]]) -> list[aioccl.Communicator]:
    uid = aioccl.UniqueId.new(host="127.0.0.1")
    with mock.patch.dict(os.environ, TRANSPORT_ENV[transport]):  # read while the communicators form
        comms = list(await gather(*(aioccl.Communicator.create(uid, r, n, timeout=timeout, engine=engine)
                                    for r in range(n))))
    assert n == 1 or all(c.transport == transport for c in comms), [c.transport for c in comms]
    return comms


@pytest_asyncio.fixture(params=["tcp", "shm", "ib"])
async def comms3(request):
    """Three communicators in this process: over sockets, over shared memory, and over the ib transport
    on its loopback verbs backend."""
    comms = await make_comms(3, transport=request.param)
    yield comms
    await close_all(comms)
