"""What the driver does for a process that ended: its device memory goes (the stand-in's device memory is a
file in /dev/shm, ``fakecupy-<pid>-<n>``). A standalone module, so that the tests can call it without importing
the stand-in's ``cupy`` into their own process."""

from __future__ import annotations

import os


def reclaim() -> list[str]:
    """Unlink the segments of processes that no longer run (a process that exits unlinks its own: the
    stand-in's ``runtime._release``; one that was killed cannot). Returns the names unlinked."""
    gone = []
    for name in os.listdir("/dev/shm"):
        parts = name.split("-")
        if len(parts) != 3 or parts[0] != "fakecupy" or not parts[1].isdigit():
            continue
        try:
            os.kill(int(parts[1]), 0)
            continue  # its process still runs
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        try:
            os.unlink(f"/dev/shm/{name}")
            gone.append(name)
        except FileNotFoundError:
            pass
    return gone
