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

    reasons = _core.answers_setup(Declined, Handover)  # the Declined of each of the C lanes' reasons, made once
    core = _core


def status() -> str:
    """One line for ``aioccl-info``: whether the core is loaded, from where, or why not."""
    if core is not None:
        return f"loaded ({os.path.basename(core.__file__ or '?')})"
    return f"not loaded: {why_not}"


_load()
