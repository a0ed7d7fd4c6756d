"""Is there a usable GPU? Answered once, lazily, with a reason a person can act on.

``import aioccl`` never imports cupy: the first GPU buffer (or
``aioccl-info``) calls ``status()``, which imports cupy and asks the CUDA
runtime for devices. Every failure becomes one sentence (no cupy, no driver,
a driver too old for this cupy, no visible device) that GPU errors, skipped
tests and ``aioccl-info`` all repeat.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType

from ..errors import InvalidArgument


@dataclass(frozen=True)
class GpuStatus:
    available: bool
    reason: str  # why not; or what was found ("cupy 14.2.0, CUDA runtime 12080, 1 device: NVIDIA H100")
    devices: int = 0


_lock = threading.Lock()
_cached: GpuStatus | None = None


def status(refresh: bool = False) -> GpuStatus:
    """Probe cupy and the CUDA driver (once per process unless ``refresh``)."""
    global _cached
    with _lock:
        if _cached is None or refresh:
            _cached = _probe()
        return _cached


def _probe() -> GpuStatus:
    try:
        import cupy
    except ImportError as e:
        return GpuStatus(False, f"cupy is not installed ({e}); install the GPU extra: pip install 'aioccl[gpu]'")
    except Exception as e:  # noqa: BLE001 - a broken cupy install: say what it raised
        return GpuStatus(False, f"cupy failed to import: {type(e).__name__}: {e}")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - CUDARuntimeError: no driver, or a driver too old
        return GpuStatus(False, f"cupy {cupy.__version__} found no usable CUDA driver: {e}")
    if count == 0:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        hint = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        return GpuStatus(False, f"cupy {cupy.__version__}: the CUDA driver sees no device{hint}")
    try:
        names = [cupy.cuda.runtime.getDeviceProperties(i)["name"] for i in range(count)]
        label = ", ".join(n.decode() if isinstance(n, bytes) else str(n) for n in names)
        runtime = cupy.cuda.runtime.runtimeGetVersion()
    except Exception as e:  # noqa: BLE001
        return GpuStatus(False, f"cupy {cupy.__version__}: cannot query the CUDA devices: {e}")
    return GpuStatus(True, f"cupy {cupy.__version__}, CUDA runtime {runtime}, {count} device(s): {label}", count)


def load_cupy(what: str) -> ModuleType:
    """cupy, or ``InvalidArgument`` saying why ``what`` (an argument, a feature) cannot use the GPU."""
    st = status()
    if not st.available:
        raise InvalidArgument(f"{what} needs the GPU path, which is unavailable: {st.reason}")
    import cupy

    return cupy  # type: ignore[no-any-return]  # cupy has no type information


def sync_hint(env: Mapping[str, str]) -> str:
    """How same-host ranks sharing a GPU will be synchronised (``aioccl-info``; the setup measures it)."""
    forced = env.get("AIOCCL_GPU_SYNC", "auto")
    if forced != "auto":
        return f"AIOCCL_GPU_SYNC={forced}"
    pipe = env.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    if os.path.exists(os.path.join(pipe, "control")):
        return (f"an MPS control daemon answers at {pipe}: ranks sharing a GPU should run at once and spin on "
                f"flags (the setup measures a hand-off to be sure)")
    return (f"no MPS control daemon at {pipe}: ranks sharing a GPU are time-sliced and wait with "
            f"cuStreamWaitValue32 (slower; start nvidia-cuda-mps-control -d); one process per GPU spins")
