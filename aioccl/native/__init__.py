"""The native core's one Python owner: loads ``aioccl.native._core`` (C, built from ``src/``) or says why not.

Why native code at all: a small op through the Python engine pays ~14 us of interpreted steps; the
same protocol in C costs about a microsecond, the order of the wait itself (README.md here). The core
runs the per-op path of a same-host communicator's shared-memory channel: staging, publishing,
waiting with the GIL released, reducing in rank order. Python keeps the set-up (segments, plans,
knobs) and every slow path (parking on the doorbell, deadlines, failures), so a native op hands over
to the engine wherever it has to wait longer than a spin.

``AIOCCL_NATIVE=0`` takes the Python path everywhere (A/B runs, debugging). When the module cannot be
loaded, ``import aioccl`` still works on the Python path and warns once, naming why.

Nothing here imports the rest of aioccl: the native layer sits below the engine.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from types import ModuleType

core: ModuleType | None = None  # the extension module, when loaded and switched on
why_not = ""  # why ``core`` is None
reasons: tuple[str, ...] = ()  # the reasons the C lanes decline for (answers.h), once loaded


def _load() -> None:
    global core, why_not, reasons
    setting = os.environ.get("AIOCCL_NATIVE", "1").strip().lower()
    if setting in ("0", "false", "no", "off"):
        why_not = "switched off by AIOCCL_NATIVE=0"
        return
    try:
        from . import _core
    except ImportError as e:
        why_not = f"the compiled module could not be loaded ({e}); reinstall aioccl (pip install .) to build it"
        warnings.warn(f"aioccl: native core unavailable, small ops take the slower Python path: {why_not}",
                      RuntimeWarning, stacklevel=3)
        return
    from .answers import Declined, Handover

    try:
        jitter_settings()
    except ValueError as e:
        warnings.warn(f"aioccl: {e}; the core runs without jitter", RuntimeWarning, stacklevel=3)
    reasons = _core.answers_setup(Declined, Handover)  # the Declined of each of the C lanes' reasons, made once
    core = _core


def jitter_settings(env: Mapping[str, str] = os.environ) -> tuple[int | None, int]:
    """``AIOCCL_JITTER`` (a seed: the hang hunter's randomized schedules, ``src/core/jitter.h``; unset: off) and
    ``AIOCCL_JITTER_RATE`` (percent of the core's hand-offs that yield or sleep first, default 10). The core
    reads them itself when it loads; this parser is what ``aioccl-info`` and the communicator's knob check run,
    so a bad value is named instead of switching the noise off in silence."""
    seed_s, rate_s = env.get("AIOCCL_JITTER", "").strip(), env.get("AIOCCL_JITTER_RATE", "").strip()
    if seed_s and not seed_s.isdigit():
        raise ValueError(f"AIOCCL_JITTER={seed_s!r}: expected a seed, a non-negative integer")
    if rate_s and not (rate_s.isdigit() and int(rate_s) <= 100):
        raise ValueError(f"AIOCCL_JITTER_RATE={rate_s!r}: expected a percentage, 0 to 100")
    return (int(seed_s) if seed_s else None), (int(rate_s) if rate_s else 10)


def status() -> str:
    """One line for ``aioccl-info``: whether the core is loaded, from where, or why not."""
    if core is not None:
        return f"loaded ({os.path.basename(core.__file__ or '?')})"
    return f"not loaded: {why_not}"


_load()
