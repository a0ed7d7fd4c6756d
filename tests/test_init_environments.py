"""aioccl.init() end to end in real processes, under each launcher's environment variables."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT, WORKERS, reserved_port


def torchrun(rank: int, n: int, port: int) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": str(n), "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port)}


def ompi(rank: int, n: int, port: int) -> dict[str, str]:
    return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(n),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(rank), "OMPI_COMM_WORLD_LOCAL_SIZE": str(n),
            "AIOCCL_COMM_ID": f"127.0.0.1:{port}"}


def slurm(rank: int, n: int, port: int) -> dict[str, str]:
    return {"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(n), "SLURM_LOCALID": str(rank),
            "SLURM_NODELIST": "localhost", "SLURM_JOB_ID": str(port - 20000)}


@pytest.mark.parametrize("make_env", [torchrun, ompi, slurm])
def test_init_from_launcher_environment(make_env):
    n = 3
    # Slurm's port is derived from the job id: reserve one in its range
    reservation = reserved_port(lo=20000, hi=40000) if make_env is slurm else reserved_port()
    port = reservation.port
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AIOCCL_", "RANK", "WORLD_SIZE", "OMPI_",
                                                                     "SLURM_", "MASTER_"))}
    procs = [subprocess.Popen([sys.executable, str(WORKERS / "env_init.py")],
                              env={**base, "PYTHONPATH": str(ROOT), **make_env(r, n, port)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(n)]
    with reservation:  # held until the ranks are done with it
        outs = [p.communicate(timeout=60) for p in procs]
    for r, (p, (out, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, err[-2000:]
        assert out.strip() == f"rank={r} size={n} local={r} sum=6"
        assert "no AIOCCL_COMM_SECRET" in err  # a secret derived from the job's identity is announced as weak
