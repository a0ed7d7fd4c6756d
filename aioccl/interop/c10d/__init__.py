"""aioccl as a ``torch.distributed`` backend: ``dist.init_process_group(backend="aioccl")``.

torch finds the backend through the ``torch.backends`` entry point (``autoload``
runs at the end of ``import torch``; ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns
that off), and ``import aioccl`` registers it too when torch was imported
first. Nothing here imports aioccl's communicator or torch's process group
classes until a group is made: registering costs one dictionary entry.

- ``backend.py``: the creator torch calls, communicators from torch's store
  (the world) or from the world's connections (``new_group``).
- ``process_group.py``: the ``ProcessGroup`` subclass, every c10d op.
- ``work.py``: aioccl's ``Work`` as a torch ``Work`` and ``Future``; aioccl's
  errors as ``DistBackendError``.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

BACKEND_NAME = "aioccl"
DEVICES = ["cpu", "cuda"]  # CUDA tensors take aioccl's GPU path (cupy), as Gloo takes them: docs/torch.md


def register() -> bool:
    """Make ``backend="aioccl"`` known to ``torch.distributed`` (once); False without torch.distributed."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not getattr(dist, "is_available", lambda: False)():
        return False
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return True
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=list(DEVICES))
    return True


def autoload() -> None:
    """The ``torch.backends`` entry point. It must never break ``import torch``: a failure is a warning."""
    try:
        import torch.distributed  # noqa: F401  (imported by torch already; this only names it)

        register()
    except Exception as e:  # noqa: BLE001
        warnings.warn(f"aioccl could not register its torch.distributed backend: {e!r}", RuntimeWarning,
                      stacklevel=2)


def _create(options: Any, backend_options: Any) -> Any:
    from .backend import create

    return create(options, backend_options)
