"""Reading a launcher's environment: a pure function from a mapping to a ``LaunchEnv``.

Understood, first match wins: aioccl's own (``AIOCCL_RANK``,
``AIOCCL_WORLD_SIZE``, ``AIOCCL_LOCAL_RANK``, ``AIOCCL_COMM_ID``), torchrun's
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``),
Open MPI's (``OMPI_COMM_WORLD_*``) and Slurm's (``SLURM_PROCID``, ...).
The root address comes from ``AIOCCL_COMM_ID``, else ``MASTER_ADDR`` /
``MASTER_PORT``, else (single-host MPI or Slurm jobs) loopback with a port
derived from the job id. The secret comes from ``AIOCCL_COMM_SECRET``; without
one it is derived from the job's identity, which keeps jobs apart but is no
protection against an attacker (a warning says so).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import BootstrapError

DEFAULT_PORT = 29500


@dataclass(frozen=True)
class LaunchEnv:
    rank: int
    world_size: int
    local_rank: int
    host: str
    port: int
    secret: bytes
    source: str  # "aioccl" | "torchrun" | "mpi" | "slurm"
    weak_secret: bool


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise BootstrapError(f"{name}={env[name]!r} is not an integer") from None


def first_slurm_host(nodelist: str) -> str:
    """First host of a Slurm nodelist such as ``node[03-05,7],gpu1``."""
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist)
    if not m:
        raise BootstrapError(f"cannot parse SLURM_NODELIST={nodelist!r}")
    prefix, ranges = m.group(1), m.group(2)
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def read(env: Mapping[str, str]) -> LaunchEnv:
    if "AIOCCL_RANK" in env:
        source, rank, size = "aioccl", _int(env, "AIOCCL_RANK"), _int(env, "AIOCCL_WORLD_SIZE")
        local = _int(env, "AIOCCL_LOCAL_RANK") if "AIOCCL_LOCAL_RANK" in env else 0
    elif "RANK" in env and "WORLD_SIZE" in env:
        source, rank, size = "torchrun", _int(env, "RANK"), _int(env, "WORLD_SIZE")
        local = _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0
    elif "OMPI_COMM_WORLD_RANK" in env:
        source, rank, size = "mpi", _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE")
        local = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK") if "OMPI_COMM_WORLD_LOCAL_RANK" in env else 0
    elif "SLURM_PROCID" in env:
        source, rank, size = "slurm", _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS")
        local = _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0
    else:
        raise BootstrapError("no launcher environment found: set AIOCCL_RANK/AIOCCL_WORLD_SIZE/AIOCCL_COMM_ID "
                             "(or run under aioccl-run, torchrun, mpirun or srun)")
    if not 0 <= rank < size:
        raise BootstrapError(f"rank {rank} out of range for world size {size} (from {source})")
    host, port = _root_address(env, source)
    job = env.get("SLURM_JOB_ID") or env.get("OMPI_MCA_ess_base_jobid") or env.get("TORCHELASTIC_RUN_ID") or ""
    given = comm_secret(env)
    if given is not None:
        secret, weak = given, False
    else:
        seed = f"aioccl-job|{source}|{job}|{host}|{port}|{size}".encode()
        secret, weak = hashlib.blake2b(seed, digest_size=16).digest(), True
    return LaunchEnv(rank, size, local, host, port, secret, source, weak)


def comm_secret(env: Mapping[str, str]) -> bytes | None:
    """``AIOCCL_COMM_SECRET`` as bytes (None when unset); ``BootstrapError`` saying how to make one if malformed."""
    text = env.get("AIOCCL_COMM_SECRET", "").strip()
    if not text:
        return None
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        secret = b""
    if len(secret) != 16:
        raise BootstrapError("AIOCCL_COMM_SECRET must be 32 hex digits; make one with: "
                             "python3 -c 'import secrets; print(secrets.token_hex(16))'")
    return secret


def _root_address(env: Mapping[str, str], source: str) -> tuple[str, int]:
    if env.get("AIOCCL_COMM_ID"):
        host, _, port = env["AIOCCL_COMM_ID"].rpartition(":")
        if not host or not port.isdigit():
            raise BootstrapError(f"AIOCCL_COMM_ID={env['AIOCCL_COMM_ID']!r} must be host:port")
        return host.strip("[]"), int(port)
    if env.get("MASTER_ADDR"):
        master_port = int(env.get("MASTER_PORT", DEFAULT_PORT))
        if source == "torchrun" and env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            master_port += 1  # torchrun's agent already serves its store on MASTER_PORT
        return env["MASTER_ADDR"], master_port
    if source == "slurm" and env.get("SLURM_NODELIST"):
        job = int(env.get("SLURM_JOB_ID", "0") or 0)
        return first_slurm_host(env["SLURM_NODELIST"]), 20000 + job % 20000
    if source == "mpi" and env.get("OMPI_COMM_WORLD_LOCAL_SIZE") == env.get("OMPI_COMM_WORLD_SIZE"):
        jobid = env.get("OMPI_MCA_ess_base_jobid", "0")
        return "127.0.0.1", 20000 + int(hashlib.md5(jobid.encode()).hexdigest(), 16) % 20000
    raise BootstrapError(f"{source} environment without a root address: set AIOCCL_COMM_ID=host:port "
                         "or MASTER_ADDR/MASTER_PORT")
