"""Per-call logging of jax_ext's collectives, switched at run time (mpi4jax's ``set_logging``).

Why a switch of our own rather than aioccl's ``AIOCCL_DEBUG``: the lines a
user of mpi4jax expects come from the host callback, once per op that XLA
runs, with the op's wall time, and they go to stdout beside the program's own
prints. Off by default; ``AIOCCL_JAX_DEBUG=1`` turns it on at import.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

_enabled = os.environ.get("AIOCCL_JAX_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


def set_logging(enable: bool) -> None:
    """Print a line when each jax_ext op starts and one when it is done (with its time), or stop."""
    global _enabled
    _enabled = bool(enable)


def get_logging() -> bool:
    """Whether ``set_logging`` (or ``AIOCCL_JAX_DEBUG``) turned per-call logging on."""
    return _enabled


@contextmanager
def logged(rank: int, what: str, items: int, device: str = "") -> Iterator[None]:
    """``r<rank> | <id> | <what> with <items> items`` before, ``... done (<seconds>s)`` after (or ``failed``)."""
    if not _enabled:
        yield
        return
    ident = secrets.token_hex(4)
    tag = f" ({device})" if device else ""
    sys.stdout.write(f"r{rank} | {ident} | {what}{tag} with {items} items\n")
    sys.stdout.flush()
    t0 = time.perf_counter()
    outcome = "failed"
    try:
        yield
        outcome = "done"
    finally:
        sys.stdout.write(f"r{rank} | {ident} | {what}{tag} {outcome} ({time.perf_counter() - t0:.2e}s)\n")
        sys.stdout.flush()
