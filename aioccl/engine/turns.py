"""When a long op on a shared-memory channel hands its event loop back: the loop-lag promise, kept cheaply.

A large op runs its steps back to back; on the inline engine that is the caller's loop, so its timers and
other tasks would wait for the whole op. Every ``AIOCCL_LOOP_SLICE_US`` (200 us) the channel asks whether
anything waits for the loop (a ready callback, a due timer, a ready file descriptor) and only then hands it
back (``benchmarks/loop_lag.py``: lag p99 <= 1 ms beside 64 MiB all_reduces). Handing it back when nothing
waits cost a loop turn per slice, and the peer a wait for it: a 1 MiB all_reduce took 15% longer (issue 56).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping

from ..envvars import env_int

DEFAULT_SLICE_US = 200  # a long op asks whether the loop is wanted at least this often


def loop_slice_s(env: Mapping[str, str] = os.environ) -> float:
    """``AIOCCL_LOOP_SLICE_US``: the longest run of steps a channel takes before it asks whether the loop is
    wanted (on the inline engine, the caller's loop: its timers and other tasks wait at most this, plus one
    step)."""
    return env_int(env, "AIOCCL_LOOP_SLICE_US", DEFAULT_SLICE_US, 50, 1_000_000) * 1e-6


def loop_waits(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether anything besides the running op waits for ``loop``: a ready callback, a due timer, or a file
    descriptor ready to read or write (polled without blocking; the loop's selector is level-triggered, so
    the events come again at its next turn). asyncio's own loops keep these in ``_ready``, ``_scheduled`` and
    ``_selector``; any other loop (uvloop) is taken to be waiting, always."""
    ready = getattr(loop, "_ready", None)
    timers = getattr(loop, "_scheduled", None)
    selector = getattr(loop, "_selector", None)
    if ready is None or timers is None or selector is None:
        return True
    if ready or (timers and timers[0].when() <= loop.time()):
        return True
    return bool(selector.select(0))
