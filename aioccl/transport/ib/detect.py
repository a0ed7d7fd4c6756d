"""Is there a usable RDMA port, and if not, exactly why not. Never raises; cached per setting.

The verdict is what ``aioccl-info`` prints, what the engine logs once, and
what skipped ``rdma`` tests give as their reason. Settings, as NCCL's:

- ``AIOCCL_IB_DISABLE=1``: never use ib;
- ``AIOCCL_IB_HCA``: which devices and ports, NCCL syntax: ``mlx5_0:1,mlx5_1``
  (prefixes), ``=mlx5_0`` (exact names), ``^mlx5_2`` (all but these);
- ``AIOCCL_IB_GID_INDEX``: the GID table index (default: the first RoCE v2
  IPv4 GID on Ethernet ports, 0 on InfiniBand);
- ``AIOCCL_IB_BACKEND=loopback``: the in-process test backend (not a NIC).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from ... import log

_log = log.get("NET")
KEYS = ("AIOCCL_IB_DISABLE", "AIOCCL_IB_HCA", "AIOCCL_IB_GID_INDEX", "AIOCCL_IB_BACKEND")
UVERBS_SYSFS = "/sys/class/infiniband_verbs"
PORT_ACTIVE = 4
LINK_ETHERNET = 2
GID_TYPE_ROCE_V2 = 2
_STATES = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}


@dataclass(frozen=True)
class PortChoice:
    device: str
    port: int
    gid_index: int
    link: str  # "InfiniBand", "Ethernet" (RoCE) or "loopback"


@dataclass(frozen=True)
class Verdict:
    usable: bool
    reason: str  # one sentence: what was found, or why nothing is usable
    ports: tuple[PortChoice, ...] = field(default=())
    backend: str = "pyverbs"


def parse_hca(spec: str) -> tuple[bool, bool, list[tuple[str, int | None]]]:
    """NCCL_IB_HCA syntax -> (exclude, exact, [(name, port or None)])."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    spec = spec.lstrip("^")
    exact = spec.startswith("=")
    spec = spec.lstrip("=")
    items = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, port = part.partition(":")
        items.append((name, int(port) if port.isdigit() else None))
    return exclude, exact, items


def hca_selects(spec: str, device: str, port: int) -> bool:
    if not spec.strip():
        return True
    exclude, exact, items = parse_hca(spec)
    hit = any((device == n if exact else device.startswith(n)) and (p is None or p == port) for n, p in items)
    return hit != exclude


def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() not in ("", "0", "false", "no")


def _pick_gid(ctx: Any, port: int, attr: Any, wanted: int | None) -> tuple[int | None, str]:
    """(gid index, why not) for one port."""
    if wanted is not None:
        gid = str(ctx.query_gid(port, wanted))
        return (wanted, "") if int(gid.replace(":", ""), 16) else (None, f"GID index {wanted} is empty")
    if attr.link_layer != LINK_ETHERNET:
        return (0, "") if attr.lid else (None, "no LID assigned (is a subnet manager running?)")
    best: int | None = None
    for i in range(min(int(attr.gid_tbl_len), 256)):
        try:
            gid = str(ctx.query_gid(port, i))
        except Exception:
            continue
        if not int(gid.replace(":", ""), 16):
            continue
        v4 = gid.replace(":", "").startswith("00000000000000000000ffff")
        try:
            v2 = int(ctx.query_gid_type(port, i)) == GID_TYPE_ROCE_V2
        except Exception:
            v2 = False
        if v2 and v4:
            return i, ""
        best = i if best is None else best
    return (best, "") if best is not None else (None, "no usable GID (no IP address on the netdev?)")


def import_pyverbs() -> ModuleType:
    """``import pyverbs.device`` without letting it touch the application's logging.

    Importing pyverbs calls ``logging.basicConfig(level=INFO)``, which would give the root logger a
    handler and the INFO level: every library's INFO records, ours from other threads included, would
    start reaching stderr. ``basicConfig`` does nothing when the root logger already has a handler, so
    for the import's duration it gets one that behaves exactly like having none (logging's last-resort
    stderr handler, WARNING and up); whatever was there before is restored afterwards.
    """
    root = logging.getLogger()
    with _import_lock:
        handlers, level = list(root.handlers), root.level
        if not handlers and logging.lastResort is not None:
            root.addHandler(logging.lastResort)
        try:
            import pyverbs.device

            return pyverbs.device  # type: ignore[no-any-return]  # pyverbs has no type information
        finally:
            root.handlers[:] = handlers
            root.setLevel(level)


_import_lock = threading.Lock()


def probe(env: Mapping[str, str], verbs: ModuleType | None = None) -> Verdict:
    """The detection itself, uncached; ``verbs`` stands in for ``pyverbs.device`` in tests."""
    if _truthy(env.get("AIOCCL_IB_DISABLE")):
        return Verdict(False, "disabled by AIOCCL_IB_DISABLE=1")
    backend = env.get("AIOCCL_IB_BACKEND", "pyverbs").strip() or "pyverbs"
    if backend == "loopback":
        return Verdict(True, "loopback test backend (in-process copies; a test of the protocol, not of a NIC)",
                       (PortChoice("loop0", 1, 0, "loopback"),), "loopback")
    if backend != "pyverbs":
        return Verdict(False, f"AIOCCL_IB_BACKEND={backend!r} is not one of pyverbs, loopback")
    raw_gid = env.get("AIOCCL_IB_GID_INDEX", "").strip()
    if raw_gid and not raw_gid.isdigit():
        return Verdict(False, f"AIOCCL_IB_GID_INDEX={raw_gid!r} is not a non-negative integer")
    wanted = int(raw_gid) if raw_gid else None
    if verbs is None:
        try:
            verbs = import_pyverbs()
        except ImportError as e:
            return Verdict(False, f"pyverbs not installed ({e}); on Debian/Ubuntu: apt install python3-pyverbs")
    try:
        devices = verbs.get_device_list()
    except Exception as e:
        if not os.path.isdir(UVERBS_SYSFS):
            return Verdict(False, f"kernel has no uverbs (ENOSYS): {UVERBS_SYSFS} is missing "
                                  "(load ib_uverbs and a NIC driver, or rdma_rxe for soft-RoCE)")
        return Verdict(False, f"listing RDMA devices failed: {e}")
    if not devices:
        return Verdict(False, "no RDMA device")
    spec = env.get("AIOCCL_IB_HCA", "")
    found, why, chosen = [], [], []
    for dev in devices:
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        found.append(name)
        try:
            ctx = verbs.Context(name=name)
            nports = int(ctx.query_device().phys_port_cnt)
        except Exception as e:
            why.append(f"{name}: cannot open ({e})")
            continue
        for port in range(1, nports + 1):
            if not hca_selects(spec, name, port):
                continue
            try:
                attr = ctx.query_port(port)
                if attr.state != PORT_ACTIVE:
                    why.append(f"{name}:{port} port down (state {_STATES.get(attr.state, attr.state)})")
                    continue
                gid, no = _pick_gid(ctx, port, attr, wanted)
            except Exception as e:
                why.append(f"{name}:{port}: query failed ({e})")
                continue
            if gid is None:
                why.append(f"{name}:{port}: {no}")
                continue
            link = "Ethernet" if attr.link_layer == LINK_ETHERNET else "InfiniBand"
            chosen.append(PortChoice(name, port, gid, link))
    if chosen:
        desc = ", ".join(f"{c.device}:{c.port} ({c.link}, GID index {c.gid_index})" for c in chosen)
        return Verdict(True, f"usable: {desc}", tuple(chosen))
    if not why:
        return Verdict(False, f"no RDMA device matches AIOCCL_IB_HCA={spec!r} (found: {', '.join(found)})")
    return Verdict(False, "; ".join(why))


_cache: dict[tuple[str, ...], Verdict] = {}


def detect(env: Mapping[str, str] | None = None) -> Verdict:
    """The cached verdict for the current settings, logged once per setting."""
    env = os.environ if env is None else env
    key = tuple(env.get(k, "") for k in KEYS)
    v = _cache.get(key)
    if v is None:
        try:
            v = probe(env)
        except Exception as e:  # never raise: a broken stack is a reason, not a crash
            v = Verdict(False, f"detection failed: {e!r}")
        _cache[key] = v
        _log.info("ib: %s", v.reason)
    return v
