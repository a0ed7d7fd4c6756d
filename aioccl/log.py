"""Logging in the manner of ``NCCL_DEBUG``, built on ``logging``.

``AIOCCL_DEBUG`` = ``WARN`` | ``INFO`` | ``TRACE`` turns on a stderr handler;
``AIOCCL_DEBUG_SUBSYS`` = ``INIT,NET`` (or ``^NET`` to exclude) filters the
subsystems. Without ``AIOCCL_DEBUG`` an application's own logging configuration decides;
where it has none (no handler on the root logger), aioccl's warnings reach
stderr in the same format, with host, pid, rank and subsystem, where
logging's last resort would print a bare line nobody can place.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading

TRACE = 5
logging.addLevelName(TRACE, "TRACE")
SUBSYSTEMS = ("INIT", "BOOTSTRAP", "NET", "COLL", "P2P", "ENV", "PROXY", "ALLOC", "LANES")

_state = {"rank": "?"}
_configured = False


def set_rank(rank: int) -> None:
    _state["rank"] = str(rank)


class _Format(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self._host = socket.gethostname()

    def format(self, record: logging.LogRecord) -> str:
        sub = record.name.rpartition(".")[2] if record.name != "aioccl" else "ALL"
        return (
            f"{self._host}:{os.getpid()}:{threading.get_ident() % 100000} [{_state['rank']}] "
            f"AIOCCL {record.levelname} {sub} {record.getMessage()}"
        )


class _SubsysFilter(logging.Filter):
    def __init__(self, spec: str) -> None:
        super().__init__()
        self.exclude = spec.startswith("^")
        names = spec[1:] if self.exclude else spec
        self.names = {n.strip().upper() for n in names.split(",") if n.strip()}

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.names or "ALL" in self.names:
            return not self.exclude
        sub = record.name.rpartition(".")[2]
        return (sub in self.names) != self.exclude


class _Fallback(logging.Handler):
    """aioccl's warnings to stderr, formatted, only while the application has configured no logging."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(_Format())

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers or _configured:  # the app's configuration (or AIOCCL_DEBUG's) decides
            return
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 - logging never raises into the library
            self.handleError(record)


def configure_from_env(env: dict[str, str] | None = None) -> None:
    """Install the ``AIOCCL_DEBUG`` handler once; later calls are no-ops."""
    global _configured
    if _configured:
        return
    env = dict(os.environ) if env is None else env
    level_name = env.get("AIOCCL_DEBUG", "").upper()
    if not level_name:
        return
    _configured = True
    level = {"WARN": logging.WARNING, "WARNING": logging.WARNING, "INFO": logging.INFO,
             "TRACE": TRACE, "DEBUG": logging.DEBUG, "VERSION": logging.INFO}.get(level_name, logging.INFO)
    root = logging.getLogger("aioccl")
    handler = logging.StreamHandler()
    handler.setFormatter(_Format())
    handler.addFilter(_SubsysFilter(env.get("AIOCCL_DEBUG_SUBSYS", "")))
    root.removeHandler(_FALLBACK)
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False


def get(subsys: str) -> logging.Logger:
    """The logger of one subsystem, e.g. ``get("NET")`` -> ``aioccl.NET``."""
    return logging.getLogger(f"aioccl.{subsys}")


_FALLBACK = _Fallback()
logging.getLogger("aioccl").addHandler(_FALLBACK)
