"""Meeting through Ray itself: rank 0 publishes its ``UniqueId`` in Ray's internal key-value store (the GCS, which
every process of the cluster reaches already), the others read it there. No port or variable for the user to set.

The key is the group's name, per use (``KINDS``: the ``ray.util.collective`` backend's groups and ``init_group``'s
communicators are different communicators, so one name may serve both at once). Rank 0 deletes the key once the
communicator exists (every rank has met its root by then), so a group destroyed and made again under its name
starts from no key. It does so on a thread of its own (two calls to the store, ~1 ms on a loaded machine, kept
out of the group's formation and its first op); its next publication under that key waits for the removal, so a
removal never takes a newer id away. A key left behind by a rank 0 that died before that is stale: rank 0
overwrites it, and a rank that tried it (the root refuses: the id says the root was up when published) waits
for the next value instead of failing, until its deadline. The waits poll the store, 0.25 ms after the first
look and doubling up to ``POLL_S`` (50 ms, as Ray's Gloo backend polls): a fixed 50 ms made every group take
50-80 ms to form.

With ``AIOCCL_COMM_SECRET`` set in the actors' environment the secret stays off the store (the root's address
only), as under torch's store (``interop/c10d/backend.py``); without it rank 0 makes a random one, and the store
carries it to the members only.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

import ray
from ray.experimental import internal_kv

from ..bootstrap.mesh import ROOT_GONE, STALE_ROOT
from ..bootstrap.unique_id import UniqueId
from ..environment import comm_secret
from ..errors import BootstrapError, InvalidArgument

NAMESPACE = "aioccl"
KINDS = ("collective", "comm")  # ray.util.collective's backend; aioccl.ray.init_group
POLL_S = 0.05  # the longest wait between two looks at the store
FIRST_POLL_S = 0.00025  # the first: ranks arrive within a millisecond or two of rank 0 (a look: one GCS call)
OWN_SECRET = "/secret-from-AIOCCL_COMM_SECRET"  # stored in place of the secret: every actor has it


def key(kind: str, name: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return f"{kind}/{name}"


def check_group(world_size: Any, rank: Any, name: Any) -> None:
    """A group's shape, checked before anything is published."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"the group's name must be a non-empty str, got {name!r}")
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise InvalidArgument(f"world_size must be a positive int, got {world_size!r}")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
        raise InvalidArgument(f"rank {rank!r} out of range for world_size {world_size} (group {name!r})")


@dataclass
class Meeting:
    """One rank's side of a group's meeting, without its waits (the callers sleep: ``time`` or ``asyncio``)."""

    kind: str
    name: str
    rank: int
    deadline: float  # time.monotonic()
    published: str = ""  # rank 0: what it put under the key
    tried: set[str] = field(default_factory=set)  # ids whose root refused this rank
    error: BaseException | None = None  # the last refusal
    wait_s: float = FIRST_POLL_S  # the next pause between looks at the store

    def pause(self) -> float:
        """How long to wait before the next look: 0.25 ms, doubling to ``POLL_S``."""
        wait, self.wait_s = self.wait_s, min(POLL_S, 2 * self.wait_s)
        return wait

    def next(self) -> UniqueId | None:
        """The id to try now: rank 0's own root first, then for the others what the store holds (None: wait
        ``POLL_S`` and ask again); past the deadline, the error."""
        if self.rank == 0:
            return self.host()  # (once: a failure of rank 0's is the group's, refused() raises it)
        uid = self.offer()
        if uid is None and time.monotonic() >= self.deadline:
            what = f"{self.kind} group {self.name!r}: rank {self.rank} found no live rank 0 in Ray's store"
            raise BootstrapError(f"{what} before its deadline (is rank 0's actor alive and in this group?)"
                                 + (f"; the last one tried: {self.error}" if self.error else ""))
        return uid

    def host(self) -> UniqueId:
        """Rank 0: a root in this process, its id published (over a stale one, if any)."""
        own = comm_secret(os.environ)
        k = key(self.kind, self.name)
        pending = _removing.get(k)
        if pending is not None:  # this process's removal of the key's last value: done before it is set anew
            pending.join(max(0.0, self.deadline - time.monotonic()))  # (bounded: a store that hangs is Ray's)
        uid = UniqueId.new(host=ray.util.get_node_ip_address(), secret=own)  # type: ignore[no-untyped-call]
        host = f"[{uid.host}]" if ":" in uid.host else uid.host
        self.published = f"{host}:{uid.port}{OWN_SECRET}" if own else str(uid)
        internal_kv._internal_kv_put(k, self.published, True, namespace=NAMESPACE)
        return uid

    def offer(self) -> UniqueId | None:
        """A non-root rank: the id to try now (None: none yet, or only one this rank tried)."""
        raw = internal_kv._internal_kv_get(key(self.kind, self.name), namespace=NAMESPACE)
        text = raw.decode() if raw is not None else ""
        if not text or text in self.tried:
            return None
        self.tried.add(text)
        if text.endswith(OWN_SECRET):
            own = comm_secret(os.environ)
            if own is None:
                raise InvalidArgument(f"group {self.name!r}: rank 0 keeps the secret off Ray's store "
                                      "(AIOCCL_COMM_SECRET is set there): set the same AIOCCL_COMM_SECRET here too")
            text = text[:-len(OWN_SECRET)] + "/" + own.hex()
        # rank 0 listened before it published: a refused root is gone (a stale id), so it fails in a moment
        return replace(UniqueId.parse(text), root_up=True)

    def refused(self, exc: BootstrapError) -> None:
        """The id just tried failed: a root that is gone (a stale id) sends a non-root rank back to the store for
        the next one, until the deadline; any other failure is the group's, raised at once."""
        self.error = exc
        if self.rank == 0 or time.monotonic() >= self.deadline or not (STALE_ROOT in str(exc) or ROOT_GONE in str(exc)):
            raise exc

    def done(self) -> None:
        """Rank 0, once the communicator exists or failed: the key goes (on a thread: ``_remove``), unless
        somebody replaced it since."""
        if not self.published:
            return
        k = key(self.kind, self.name)
        t = _removing[k] = threading.Thread(target=_remove, args=(k, self.published), daemon=True,
                                            name=f"aioccl-ray-forget-{k}")
        t.start()
        self.published = ""


_removing: dict[str, threading.Thread] = {}  # key -> the thread removing this process's last value of it


def _remove(k: str, published: str) -> None:
    """Delete ``k`` if it still holds ``published`` (another rank 0 may have replaced it: that one stays)."""
    try:
        now = internal_kv._internal_kv_get(k, namespace=NAMESPACE)
        if now is not None and now.decode() == published:
            internal_kv._internal_kv_del(k, namespace=NAMESPACE)
    except Exception:  # noqa: BLE001 (Ray shutting down: a key left behind is overwritten next time)
        pass
    finally:
        if _removing.get(k) is threading.current_thread():
            del _removing[k]


def declared(name: str, info: tuple[Any, ...]) -> tuple[int, int]:
    """This actor's (world_size, rank) in a group declared from the driver (``create_group`` or Ray's
    ``create_collective_group``): ``info`` is what the group's ``info_<name>`` actor holds."""
    ids, world_size, ranks = info[0], info[1], info[2]
    me = ray.get_runtime_context().get_actor_id()
    hexes = [i.hex() if hasattr(i, "hex") else str(i) for i in ids]
    if me is None or me not in hexes:
        raise InvalidArgument(f"group {name!r} was declared for other actors: this process is not one of them")
    return int(world_size), int(ranks[hexes.index(me)])


def info_actor(name: str) -> Any:
    """The named actor in which a declared group's members are kept; ``InvalidArgument`` when none is."""
    try:
        return ray.get_actor("info_" + name)
    except ValueError:
        raise InvalidArgument(f"group {name!r}: pass world_size and rank, or declare the group from the driver "
                              "first (aioccl.ray.create_group(actors, name))") from None
