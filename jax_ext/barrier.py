"""``barrier``: returns once every member entered it (ordered with the other collectives)."""

from __future__ import annotations

from typing import Any

import numpy as np

from aioccl import Communicator

from ._primitive import Group, define, group_for


def _abstract(pos: Any, *, group: Group) -> list[Any]:
    return []


def _run(comm: Communicator, ins: list[np.ndarray], outs: list[np.ndarray], same: bool) -> None:
    comm.barrier().wait()


barrier_p = define("barrier", abstract=_abstract, run=_run, multiple_results=True)


def barrier(*, axis_name: Any = None, comm: Communicator | None = None) -> None:
    """Wait, in program order, until every process of ``comm`` (or every device along ``axis_name``)
    has reached this point; an ordered effect, so jit keeps it where it is written."""
    group, pos = group_for("barrier", axis_name, comm)
    barrier_p.bind(pos, group=group)
