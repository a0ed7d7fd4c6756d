"""The communicators behind jax_ext: one per process, one rank per device, one per mesh axis group.

Why proxy threads: XLA runs our host callback on one of its own threads,
sometimes on the thread that called the jitted function. The callback blocks
until the collective is done, so the engine must run somewhere else: every
communicator here is created with ``engine="thread"``.

Why set up at lowering time: a mesh axis group is a ``split`` of the device
world, a collective over every device rank. All processes of an SPMD program
lower the same functions in the same order, so doing it while lowering (once
per mesh and axis tuple, then cached) keeps the splits matched without any
extra coordination.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

import aioccl
from aioccl import Communicator, UniqueId, log

from . import _compat

_log = log.get("JAX")
_lock = threading.RLock()
_process: Communicator | None = None
_devices: dict[int, Communicator] | None = None  # local device id -> its rank in the device world
_groups: dict[tuple[Any, ...], dict[int, Communicator]] = {}
_UID_BYTES = 256
_KV_KEY = "aioccl/jax_ext/process_uid"


def set_default_comm(comm: Communicator | None) -> None:
    """Use ``comm`` for process-level ops called without ``comm=`` (None: create one on demand again)."""
    global _process
    with _lock:
        _process = comm


def default_comm() -> Communicator:
    """The process-level communicator: rank = process index.

    From ``jax.distributed``'s key-value store when it was initialized,
    else from aioccl's launcher environment, else a 1-rank communicator.
    """
    global _process
    with _lock:
        if _process is None:
            _process = _create_process_comm()
        return _process


def _create_process_comm() -> Communicator:
    dist = _compat.distributed_client()
    if dist is not None:
        client, pid, nproc = dist
        if pid == 0:
            uid = UniqueId.new()
            client.key_value_set_bytes(_KV_KEY, str(uid).encode())
        else:
            timeout_ms = int(_env_timeout() * 1000)
            uid = UniqueId.parse(client.blocking_key_value_get_bytes(_KV_KEY, timeout_ms).decode())
        _log.info("process communicator from jax.distributed: rank %d of %d", pid, nproc)
        return Communicator.create_sync(uid, pid, nproc)
    try:
        return aioccl.init_sync()
    except aioccl.BootstrapError as e:
        if "no launcher environment" not in str(e):
            raise
    return Communicator.create_sync(UniqueId.new(host="127.0.0.1"), 0, 1)


def _env_timeout() -> float:
    from aioccl.envvars import env_timeout

    return env_timeout(os.environ)


def device_comms() -> dict[int, Communicator]:
    """The device world: one rank per device of ``jax.devices()`` (rank = its index there)."""
    global _devices
    with _lock:
        if _devices is None:
            _devices = _create_device_world()
        return _devices


def _create_device_world() -> dict[int, Communicator]:
    everyone = jax.devices()
    here = jax.process_index()
    local = [(i, d) for i, d in enumerate(everyone) if d.process_index == here]
    if jax.process_count() == 1:
        uid = UniqueId.new(host="127.0.0.1")
    else:
        proc = default_comm()
        buf = np.zeros(_UID_BYTES, np.uint8)
        if proc.rank == 0:
            text = str(UniqueId.new()).encode()
            buf[:len(text)] = np.frombuffer(text, np.uint8)
        proc.broadcast(buf, root=0).wait()
        uid = UniqueId.parse(bytes(buf).rstrip(b"\0").decode())
    size = len(everyone)
    with ThreadPoolExecutor(len(local), thread_name_prefix="aioccl-jax-init") as pool:
        futs = {d.id: pool.submit(Communicator.create_sync, uid, rank, size) for rank, d in local}
        comms = {dev: f.result() for dev, f in futs.items()}
    _log.info("device world: %d ranks, %d in this process", size, len(comms))
    return comms


def mesh_group(mesh: Any, axes: tuple[Any, ...]) -> dict[int, Communicator]:
    """Communicators of ``axes`` (in that order) for this process's devices, by flat mesh position."""
    devices = np.asarray(mesh.devices)
    key = (tuple(int(d.id) for d in devices.flat), tuple(mesh.axis_names), axes)
    with _lock:
        table = _groups.get(key)
        if table is None:
            table = _groups[key] = _split_for(devices, tuple(mesh.axis_names), axes)
        return table


def group_layout(shape: Sequence[int], names: Sequence[Any], axes: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Per flat mesh position: (group color, position inside its group).

    The position is row-major over ``axes`` in the order given, as
    ``lax.axis_index(axes)`` numbers it; the color over the other axes.
    """
    coords = np.indices(shape).reshape(len(shape), -1)
    inside = [names.index(a) for a in axes]
    outside = [i for i in range(len(names)) if i not in inside]

    def ravel(dims: list[int]) -> np.ndarray:
        flat = np.zeros(coords.shape[1], np.int64)
        for i in dims:
            flat = flat * shape[i] + coords[i]
        return flat

    return ravel(outside), ravel(inside)


def _split_for(devices: np.ndarray, names: tuple[Any, ...], axes: tuple[Any, ...]) -> dict[int, Communicator]:
    world = device_comms()
    everyone = jax.devices()
    world_rank = {int(d.id): i for i, d in enumerate(everyone)}
    color, position = group_layout(devices.shape, names, axes)
    pos_of = {int(d.id): p for p, d in enumerate(devices.flat)}
    ranks = [world_rank[int(d.id)] for d in devices.flat]
    if len(set(color.tolist())) == 1 and [ranks[int(p)] for p in np.argsort(position)] == list(range(len(everyone))):
        return {pos_of[dev]: comm for dev, comm in world.items()}  # the group is the world, same order
    works = {}
    for dev, comm in world.items():
        p = pos_of.get(dev)
        works[dev] = comm.split(None if p is None else int(color[p]), None if p is None else int(position[p]))
    table = {}
    for dev, w in works.items():
        sub = w.wait()
        if sub is not None:
            table[pos_of[dev]] = sub
    _log.info("mesh group %s of mesh %s: %d local ranks", axes, dict(zip(names, devices.shape, strict=True)),
              len(table))
    return table


def shutdown(timeout: float = 10.0) -> None:
    """Wait for in-flight jax_ext collectives, then close every communicator jax_ext created."""
    global _process, _devices
    with _lock:
        if _process is None and _devices is None:
            return
        try:
            _compat.effects_barrier()
        except Exception as e:  # noqa: BLE001 - a failed computation must not block the exit
            _log.warning("effects barrier at shutdown: %s", e)
        subs = [c for t in _groups.values() for c in t.values()]
        world = list((_devices or {}).values())
        proc = [_process] if _process is not None else []
        _groups.clear()
        _process, _devices = None, None
    for tier in (subs, world, proc):  # the ranks of one tier close together: each waits for its peers
        closing = [(comm, comm.close()) for comm in tier]
        for comm, work in closing:
            try:
                work.wait(timeout)
            except Exception as e:  # noqa: BLE001 - one bad close must not keep the others open
                _log.warning("closing %r at shutdown: %s; aborting it", comm, e)
                comm.abort()


atexit.register(shutdown)
