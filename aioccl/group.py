"""``comm.group()``: batch ops like ``ncclGroupStart/End``."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

from .work import Work

# An op held back by the group: its engine's ``launch``, the op's start, and its Work. The group holds
# each op's launch rather than its communicator, so it sits below the communicator (and the lanes,
# which read ``current_group`` to leave a group's ops to the engine, can import it).
Held = tuple[Callable[[Callable[[], Any]], None], Callable[[], Any], Work[Any]]

# the batch being collected by the current task (None outside a group)
current_group: contextvars.ContextVar[list[Held] | None] = contextvars.ContextVar("aioccl_group", default=None)


class Group:
    """Batches ops (like ``ncclGroupStart/End``): launched together at exit, which awaits them all.

    The batch is per task (a context variable), so concurrent tasks never
    capture each other's ops. Nested groups join the outermost one.
    """

    def __init__(self) -> None:
        self._token: contextvars.Token[Any] | None = None
        self._ops: list[Held] = []

    def _enter(self) -> None:
        if current_group.get() is None:
            self._token = current_group.set(self._ops)

    def _launch(self) -> list[Work[Any]]:
        if self._token is None:
            return []
        current_group.reset(self._token)
        for launch, start, _w in self._ops:
            launch(start)
        return [w for _c, _s, w in self._ops]

    async def __aenter__(self) -> Group:
        self._enter()
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        works = self._launch()
        first: BaseException | None = None
        for w in works:
            try:
                await w
            except Exception as e:  # noqa: BLE001 - re-raised below
                first = first or e
        if first is not None and exc_type is None:
            raise first

    def __enter__(self) -> Group:
        self._enter()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        works = self._launch()
        first: BaseException | None = None
        for w in works:
            try:
                w.wait()
            except Exception as e:  # noqa: BLE001 - re-raised below
                first = first or e
        if first is not None and exc_type is None:
            raise first
