"""``aioccl-info``: what this machine gives aioccl, one line each, with the reason where a feature is off.

    aioccl-info [--json]
    aioccl-run --nnodes 2 ... aioccl-info --topology   # the job's hosts and every pair's transport

Meant to be pasted into bug reports: versions, optional libraries (and why
one is missing or unusable), network interfaces and the one a rank would
use, shared-memory limits, GPU and RDMA detection, and the value in effect
of every ``AIOCCL_*`` variable, with any that fail to parse or that aioccl
does not know (a typo, most often).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Mapping
from importlib import metadata
from typing import Any

# optional distribution -> how to get it
OPTIONAL = {
    "jax": "pip install 'aioccl[jax]'",
    "cupy": "pip install 'aioccl[gpu]' (CUDA 12) or 'aioccl[gpu-cuda13]' (needs an NVIDIA driver)",
    "torch": "pip install 'aioccl[torch]'",
    "anyio": "pip install anyio",
    "trio": "pip install trio",
}


def _version(*dists: str) -> str | None:
    for d in dists:
        try:
            return metadata.version(d)
        except metadata.PackageNotFoundError:
            continue
    return None


def _module_version(module: str) -> str | None:
    """The version of whichever installed distribution provides ``module``: cupy ships as cupy-cuda11x,
    cupy-cuda12x, cupy-cuda13x, cupy-rocm-* or plain cupy, and any of them is the one that imports."""
    names = metadata.packages_distributions().get(module, [])
    return _version(*names, module)


def libraries(gpu: Any, ib: Any) -> dict[str, dict[str, Any]]:
    """Each library's version, and why it cannot serve (missing, or no driver / device behind it)."""
    import ml_dtypes
    import numpy as np

    out: dict[str, dict[str, Any]] = {
        "numpy": {"version": np.__version__, "usable": True, "detail": ""},
        "ml_dtypes": {"version": ml_dtypes.__version__, "usable": True, "detail": ""},
    }
    for name, how in OPTIONAL.items():
        v = _module_version("cupy") if name == "cupy" else _version(name)
        out[name] = {"version": v, "usable": v is not None, "detail": "" if v else f"not installed: {how}"}
    if out["cupy"]["version"] and not gpu.available:
        out["cupy"].update(usable=False, detail=gpu.reason)
    found = "pyverbs not installed" not in ib.reason  # Debian's python3-pyverbs has no pip metadata
    out["pyverbs"] = {"version": _version("pyverbs") or ("found" if found else None), "usable": ib.usable,
                      "detail": "" if ib.usable else ib.reason}
    return out


def network(env: Mapping[str, str]) -> dict[str, Any]:
    from aioccl.bootstrap import netif
    from aioccl.errors import AiocclError

    spec = env.get("AIOCCL_SOCKET_IFNAME", "").strip()
    interfaces = [{"name": n, "address": a} for n, a in netif.ipv4_interfaces()]
    root = env.get("AIOCCL_COMM_ID", "").strip()
    try:
        if spec:
            chosen, why = netif.pick_by_name(spec), f"AIOCCL_SOCKET_IFNAME={spec}"
        elif root:
            host, _, port = root.rpartition(":")
            chosen, why = netif.route_to(host, int(port or 0)), f"the route to the root {root}"
        else:
            chosen, why = netif.default_advertised(None), "the first interface that is not lo/docker/veth/virbr, " \
                                                          "else the first that is not loopback (what a new " \
                                                          "UniqueId advertises; ranks use their route to the root)"
    except (AiocclError, ValueError, OSError) as e:
        chosen, why = None, str(e)
    return {"interfaces": interfaces, "chosen": chosen, "why": why}


def shared_memory(env: Mapping[str, str]) -> dict[str, Any]:
    path = "/dev/shm"
    if env.get("AIOCCL_SHM_DISABLE", "0").strip().lower() not in ("", "0", "false", "no"):
        state = "disabled by AIOCCL_SHM_DISABLE"
    elif not os.access(path, os.W_OK):
        state = f"unavailable: {path} is not writable"
    else:
        state = "available"
    try:
        st = os.statvfs(path)
        size, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    except OSError:
        size = free = -1
    return {"state": state, "path": path, "size_bytes": size, "free_bytes": free}


def collect(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    import aioccl
    from aioccl import knobs
    from aioccl.transport.ib.detect import detect

    env = os.environ if env is None else env
    gpu = aioccl.gpu.status()
    ib = detect()
    shm = shared_memory(env)
    return {
        "aioccl": aioccl.__version__,
        "native": aioccl.native.status(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(),
        "host": platform.node(),
        "libraries": libraries(gpu, ib),
        "network": network(env),
        "shm": shm,
        "transports": {
            "tcp": "available",
            "shm": shm["state"],
            "ib": ("available: " if ib.usable else "unavailable: ") + ib.reason,
        },
        "gpu": {"available": gpu.available, "detail": gpu.reason, "devices": gpu.devices,
                "sync": aioccl.gpu.probe.sync_hint(env)},
        "env": {k.name: {"value": v, "set": s, "default": k.default, "meaning": k.meaning}
                for k, v, s in knobs.effective(env)},
        "env_unknown": knobs.unknown(env),
        "env_errors": knobs.check(env),
    }


def _size(n: int) -> str:
    return "?" if n < 0 else f"{n / 2**30:.1f} GiB"


def render(info: dict[str, Any]) -> list[str]:
    lines = [f"aioccl {info['aioccl']}  {info['python']}  on {info['host']} ({info['platform']})",
             f"native core: {info['native']}"]
    for name, lib in info["libraries"].items():
        state = lib["version"] or "-"
        lines.append(f"  {name:10s} {state}" + (f"  ({lib['detail']})" if lib["detail"] else ""))
    net = info["network"]
    lines.append("network: " + ", ".join(f"{i['name']}={i['address']}" for i in net["interfaces"]))
    lines.append(f"  a rank would use {net['chosen'] or '(none)'}: {net['why']}")
    shm = info["shm"]
    lines.append(f"shared memory: {shm['path']} {_size(shm['size_bytes'])}, {_size(shm['free_bytes'])} free")
    for name, state in info["transports"].items():
        lines.append(f"transport {name}: {state}")
    g = info["gpu"]
    lines.append(f"gpu: {'available' if g['available'] else 'unavailable'}: {g['detail']}")
    if g["available"]:
        lines.append(f"  same-host GPU ops: {g['sync']}")
    lines.append("environment (* = set):")
    for name, e in info["env"].items():
        lines.append(f"  {'*' if e['set'] else ' '} {name}={e['value']}")
    for name in info["env_unknown"]:
        lines.append(f"  ! {name} is set but aioccl does not read it (a typo?)")
    for problem in info["env_errors"]:
        lines.append(f"  ! {problem}")
    return lines


PAIR_CODES = ("self", "shm", "tcp", "ib")


def topology() -> list[str]:
    """Join the launcher's job and return, on rank 0, every host and the transport of every pair
    (``aioccl-run ... aioccl-info --topology``); other ranks return nothing."""
    import numpy as np

    import aioccl

    comm = aioccl.init_sync()
    try:
        n = comm.world_size
        mine = np.array([PAIR_CODES.index(comm.transport_to(p)) for p in range(n)], np.int8)
        every = comm.all_gather(mine).wait().reshape(n, n)
        if comm.rank:
            return []
        top = comm.topology()
        lines = [top.line().split(": ", 1)[1].split("; my pairs")[0], f"collectives: {top.collectives}",
                 "pairs (row: from rank, column: to rank):", "      " + " ".join(f"{j:>4}" for j in range(n))]
        lines += [f"  {i:>3} " + " ".join(f"{PAIR_CODES[c]:>4}" for c in every[i]) for i in range(n)]
        return lines
    finally:
        comm.close().wait()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="aioccl-info", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--json", action="store_true", help="print JSON (for bug reports) instead of lines")
    p.add_argument("--topology", action="store_true",
                   help="under a launcher: join the job; rank 0 prints its hosts and every pair's transport")
    ns = p.parse_args(argv)
    if ns.topology:
        from aioccl import environment
        from aioccl.errors import BootstrapError

        try:
            environment.read(os.environ)
        except BootstrapError:
            p.exit(2, "aioccl-info: --topology joins a job, so every rank runs it under a launcher:\n"
                      "    aioccl-run --nproc-per-node 2 aioccl-info --topology\n"
                      "(or torchrun ... -m aioccl.tools.info --topology; add --nnodes/--node-rank/--master-addr "
                      "on each host)\n")
        lines = topology()
        if lines:
            print("\n".join(lines), flush=True)
        return
    info = collect()
    try:
        if ns.json:
            json.dump(info, sys.stdout, indent=1)
            print()
        else:
            print("\n".join(render(info)))
        sys.stdout.flush()
    except BrokenPipeError:  # `aioccl-info --json | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        sys.exit(0)


if __name__ == "__main__":
    main()
