"""aioccl's own API in Ray actors: a ``Communicator`` per group, met through Ray (``rendezvous.py``).

``await init_group(world_size, rank, name)`` in an async actor gives a communicator whose engine runs on the
actor's own event loop: every op is awaitable, and the actor's other coroutines (its other method calls, its
timers) run while one waits. ``init_group_sync`` is the same for a sync actor (or a task): the engine runs on a
proxy thread and ops are waited with ``.wait()``. From the driver, ``create_group(actors, name)`` declares
which actor is which rank, so the actors call ``init_group(name=name)`` without them; the declaration is Ray's
own (``create_collective_group``), so ``ray.util.collective``'s calls with ``backend="AIOCCL"`` find it too.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from typing import Any

import ray

from ..communicator import Communicator
from ..envvars import check_timeout, env_timeout
from ..errors import BootstrapError
from .rendezvous import Meeting, check_group, declared, info_actor

BACKEND = "AIOCCL"  # its name in ray.util.collective (Ray upper-cases every backend's name)


def _deadline(timeout: float | None) -> float:
    return env_timeout(os.environ) if timeout is None else check_timeout(timeout)


async def init_group(world_size: int | None = None, rank: int | None = None, name: str = "default", *,
                     timeout: float | None = None, engine: str = "auto") -> Communicator:
    """Form group ``name`` of ``world_size`` actors as ``rank`` and return its communicator (under asyncio, as
    Ray's async actors run).

    Without ``world_size`` and ``rank`` the group must have been declared from the driver (``create_group``).
    Every member calls this once per group; ``timeout`` bounds the meeting and is every op's default deadline
    (``AIOCCL_TIMEOUT`` when None). Close the communicator (``await comm.close()``, or ``async with``) to end it;
    the name may then be used again."""
    if world_size is None or rank is None:
        world_size, rank = declared(name, await info_actor(name).get_info.remote())
    check_group(world_size, rank, name)
    t = _deadline(timeout)
    m = Meeting("comm", name, rank, time.monotonic() + t)
    try:
        while True:
            uid = m.next()
            if uid is None:
                await asyncio.sleep(m.pause())
                continue
            try:
                return await Communicator.create(uid, rank, world_size, t, engine=engine)
            except BootstrapError as e:
                m.refused(e)  # a stale id: the next one (else raised)
    finally:
        m.done()


def init_group_sync(world_size: int | None = None, rank: int | None = None, name: str = "default", *,
                    timeout: float | None = None) -> Communicator:
    """Blocking [`init_group`][aioccl.ray.init_group] for sync actors and tasks: the engine runs on a proxy
    thread and every op is waited with ``.wait()``."""
    return meet_sync("comm", world_size, rank, name, timeout)


def meet_sync(kind: str, world_size: int | None, rank: int | None, name: str,
              timeout: float | None) -> Communicator:
    """A communicator for group ``name`` (``kind``: who asks, ``rendezvous.KINDS``), met in blocking calls."""
    if world_size is None or rank is None:
        world_size, rank = declared(name, ray.get(info_actor(name).get_info.remote()))
    check_group(world_size, rank, name)
    t = _deadline(timeout)
    m = Meeting(kind, name, rank, time.monotonic() + t)
    try:
        while True:
            uid = m.next()
            if uid is None:
                time.sleep(m.pause())
                continue
            try:
                return Communicator.create_sync(uid, rank, world_size, t)
            except BootstrapError as e:
                m.refused(e)  # a stale id: the next one (else raised)
    finally:
        m.done()


def create_group(actors: Sequence[Any], name: str = "default", *, ranks: Sequence[int] | None = None) -> None:
    """From the driver: declare ``actors`` as group ``name``, ``actors[i]`` as rank ``ranks[i]`` (by default
    ``i``). Each actor then forms it with ``await aioccl.ray.init_group(name=name)`` (or ``init_group_sync``),
    and ``ray.util.collective``'s calls with ``group_name=name`` use it through the ``"AIOCCL"`` backend."""
    from ray.util.collective import create_collective_group
    from ray.util.collective.types import Backend

    from .backend import register

    register()
    n = len(actors)
    create_collective_group(list(actors), n, list(range(n)) if ranks is None else list(ranks),
                            backend=Backend(BACKEND), group_name=name)
