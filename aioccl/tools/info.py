"""``aioccl-info``: what this machine gives aioccl, one line each, with the reason where a feature is off.

    aioccl-info [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from importlib import metadata
from typing import Any


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def collect() -> dict[str, Any]:
    import numpy as np

    import aioccl
    from aioccl.transport.ib.detect import detect

    gpu = aioccl.gpu.status()
    ib = detect()
    shm_off = os.environ.get("AIOCCL_SHM_DISABLE", "0") not in ("", "0")
    shm_ok = os.access("/dev/shm", os.W_OK)
    return {
        "aioccl": aioccl.__version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "jax": _version("jax"),
        "cupy": next((v for d in ("cupy-cuda12x", "cupy-cuda11x", "cupy") if (v := _version(d))), None),
        "host": platform.node(),
        "transports": {
            "tcp": "available",
            "shm": "disabled by AIOCCL_SHM_DISABLE" if shm_off else
                   ("available" if shm_ok else "unavailable: /dev/shm is not writable"),
            "ib": ("available: " if ib.usable else "unavailable: ") + ib.reason,
        },
        "gpu": {"available": gpu.available, "detail": gpu.reason, "devices": gpu.devices},
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="aioccl-info", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print JSON instead of lines")
    ns = p.parse_args(argv)
    info = collect()
    if ns.json:
        json.dump(info, sys.stdout, indent=1)
        print()
        return
    print(f"aioccl {info['aioccl']}  python {info['python']}  numpy {info['numpy']}  "
          f"jax {info['jax'] or '-'}  cupy {info['cupy'] or '-'}  on {info['host']}")
    for name, state in info["transports"].items():
        print(f"transport {name}: {state}")
    g = info["gpu"]
    print(f"gpu: {'available' if g['available'] else 'unavailable'}: {g['detail']}")


if __name__ == "__main__":
    main()
