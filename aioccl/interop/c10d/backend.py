"""The creator ``torch.distributed`` calls for every group whose backend is aioccl.

The world (the default group) bootstraps from torch's own store: rank 0 puts
a fresh ``UniqueId`` under a key of the group's prefix store and the others
read it, so there is no second port to configure. The key names torchrun's
restart count: its store outlives an attempt, and a restarted rank must not
dial the previous attempt's root (a stale id read anyway fails in a second). Every later group
(``dist.new_group``, which torch calls on the members only) is made from the
world's connections with ``Communicator.create_group``: no new sockets, and
a shared-memory channel when its ranks share a host. A group of a world that
is not aioccl's (``new_group(backend="aioccl")`` under a Gloo default group)
bootstraps from its prefix store like a world.

Deadlines: an explicit ``init_process_group(timeout=...)`` (or a group's) is
every op's deadline. torch passes its 30-minute default when none was given;
then aioccl's own (``AIOCCL_TIMEOUT``, 300 s) applies, so a silent rank is
named in minutes, not half an hour.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import replace
from typing import Any

import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from ... import lowlevel
from ...bootstrap.unique_id import UniqueId
from ...communicator import Communicator
from ...environment import comm_secret
from ...envvars import env_timeout
from ...errors import InvalidArgument
from .process_group import AiocclProcessGroup
from .work import backend_error

UID_KEY = "aioccl/unique_id"
_world: weakref.ReferenceType[Communicator] | None = None  # the default group's communicator


def create(options: Any, backend_options: Any) -> AiocclProcessGroup:
    """``Backend.register_backend(..., extended_api=True)``'s creator: a process group of ``options``'
    ``group_rank`` of ``group_size``."""
    global _world
    rank, size = int(options.group_rank), int(options.group_size)
    members = [int(r) for r in options.global_ranks_in_group] or list(range(size))
    timeout = deadline(options.timeout)
    world = _world() if _world is not None else None
    try:
        if world is not None and not lowlevel.is_closed(world) and max(members) < world.world_size:
            comm = world.create_group(members, tag=str(options.group_id), timeout=timeout).wait()
        else:
            comm = bootstrap(options.store, rank, size, timeout)
            if not dist.is_initialized():  # the default group: later groups come from its connections
                _world = weakref.ref(comm)
    except Exception as e:
        raise backend_error(e) from e
    return AiocclProcessGroup(comm, rank, size, timeout)


def deadline(timeout: Any) -> float:
    """Seconds every op of the group may take: the caller's timeout, or aioccl's when torch's default came."""
    if timeout is None or timeout == default_pg_timeout or timeout.total_seconds() <= 0:
        return env_timeout(os.environ)
    return float(timeout.total_seconds())


def uid_key(env: Any = None) -> str:
    """The store key of a group's unique id: per torchrun restart, since torch's store may outlive an attempt
    (the group's prefix store already separates groups)."""
    env = os.environ if env is None else env
    return f"{UID_KEY}/attempt_{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"


OWN_SECRET = "/secret-from-AIOCCL_COMM_SECRET"  # in the store instead of the secret: every node has it


def bootstrap(store: Any, rank: int, size: int, timeout: float) -> Communicator:
    """A communicator of ``size`` ranks met through torch's ``store`` (rank 0 publishes the unique id).

    The secret policy is aioccl-run's: with ``AIOCCL_COMM_SECRET`` set on every node, the secret never crosses
    the network (the store gets the root's address only); without it, rank 0 makes a random one and the store
    carries it, so it keeps out whoever cannot reach the store."""
    key = uid_key()
    own = comm_secret(os.environ)
    if rank == 0:
        uid = UniqueId.new(host=os.environ.get("MASTER_ADDR") or None, secret=own)
        host = f"[{uid.host}]" if ":" in uid.host else uid.host
        store.set(key, f"{host}:{uid.port}{OWN_SECRET}" if own else str(uid))
    else:
        text = store.get(key).decode()  # blocks for the store's own timeout at most
        if text.endswith(OWN_SECRET):
            if own is None:
                raise InvalidArgument("rank 0 keeps the secret off torch's store (AIOCCL_COMM_SECRET is set "
                                      "there): set the same AIOCCL_COMM_SECRET on this node too")
            text = text[:-len(OWN_SECRET)] + "/" + own.hex()
        uid = UniqueId.parse(text)
    # rank 0 listened before it published: a refused root is gone (a stale id), so fail fast, not in minutes
    return Communicator.create_sync(replace(uid, root_up=True), rank, size, timeout)
