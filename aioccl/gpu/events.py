"""Waiting for the GPU without blocking the event loop or the device.

The engine's loop must keep moving bytes for other ops while a copy or a
kernel runs, so a CUDA event is *polled* (``cudaEventQuery``) with the loop
turning in between: no ``cudaEventSynchronize`` on the loop thread and never
a ``cudaDeviceSynchronize``. The first polls only yield (the typical copy
takes microseconds); a long kernel is then polled every half millisecond.
"""

from __future__ import annotations

import asyncio
from typing import Any

SPIN_POLLS = 200  # yields before backing off to timed sleeps
BACKOFF_S = 0.0005


async def wait_event(event: Any) -> None:
    """Return once ``event`` (anything with a ``done`` property) has completed on the GPU."""
    polls = 0
    while not event.done:
        polls += 1
        await asyncio.sleep(0 if polls < SPIN_POLLS else BACKOFF_S)
