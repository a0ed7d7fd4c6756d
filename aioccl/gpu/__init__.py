"""GPU buffers (cupy, torch CUDA tensors, JAX GPU arrays) in every op.

Nothing here imports cupy at import time; see ``README.md`` in this folder
for how an op on GPU buffers runs, and ``docs/gpu.md`` for the user's view.
"""

from .probe import GpuStatus, status

__all__ = ["GpuStatus", "status"]
