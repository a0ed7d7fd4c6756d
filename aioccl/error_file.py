"""Each rank's last words for the launcher: the exception that ended it, with the time it happened.

``aioccl-run`` gives every rank ``AIOCCL_ERROR_FILE``; importing aioccl then chains a
``sys.excepthook`` that writes the uncaught exception there as JSON before the usual traceback
(torchrun's error files do the same). The launcher reads them all once the ranks are gone and names
the rank that failed *first*, with its exception's last line: the root cause, not merely the first
process to exit (a rank that failed because a peer died exits too, often sooner).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from types import TracebackType
from typing import Any

_installed = False


def write(path: str, exc: BaseException) -> None:
    """Write ``exc`` as this rank's error file (best effort: a full disk must not hide the traceback)."""
    record = {
        "rank": os.environ.get("AIOCCL_RANK") or os.environ.get("RANK"),
        "time": time.time(),
        "type": type(exc).__name__,
        "message": str(exc).splitlines()[0] if str(exc) else "",
        "traceback": "".join(traceback.format_exception(exc))[-8000:],
        # a rank that failed because a peer was lost names it: the launcher follows that to the root cause
        "culprit": getattr(exc, "rank", None) if type(exc).__name__ == "PeerLost" else None,
    }
    try:
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


def install() -> None:
    """Chain the hook once, when the launcher asked for an error file."""
    global _installed
    path = os.environ.get("AIOCCL_ERROR_FILE", "").strip()
    if _installed or not path:
        return
    _installed = True
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if not isinstance(exc, KeyboardInterrupt):
            write(path, exc)
        previous(kind, exc, tb)

    sys.excepthook = hook


def read(path: str) -> dict[str, Any] | None:
    """A rank's error file, or None when it wrote none (killed by a signal, or exited without raising)."""
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("time"), (int, float)) else None
