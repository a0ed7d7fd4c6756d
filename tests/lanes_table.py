"""docs/architecture.md's table of lanes, rendered from each lane's declared ``RULES`` (tests/test_lanes.py)."""

from __future__ import annotations

from aioccl.lanes.cpu import CpuLane
from aioccl.lanes.door import ORDER
from aioccl.lanes.general import General
from aioccl.lanes.gpu import GpuLane
from aioccl.lanes.pair import PairLane

LANES = {lane.name: lane for lane in (CpuLane, GpuLane, PairLane, General)}


def render() -> str:
    """The table, one row per (lane, reason), the lanes in the door's order."""
    rows = ["| lane | declines | when |", "|---|---|---|"]
    seen = []
    for kind in ORDER.values():
        for name in kind:
            if name not in seen:
                seen.append(name)
    for name in seen:
        rules = LANES[name].RULES
        rows += [f"| {name} | `{reason}` | {when} |" for reason, when in rules] or [
            f"| {name} | nothing | it takes every call (a bad one raises `InvalidArgument` before anything is sent) |"]
    return "\n".join(rows)
