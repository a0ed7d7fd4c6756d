"""The GPU path's two sizes, ``AIOCCL_GPU_SCRATCH`` and ``AIOCCL_GPU_STAGE_PIECE``, read without loading
the GPU path: every communicator's creation checks its knobs (``knobs.check``), on machines with no GPU too,
and the path itself (its kernels, ml_dtypes) is loaded by the first GPU buffer only."""

from __future__ import annotations

from collections.abc import Mapping

from ..envvars import env_int

SCRATCH_DEFAULT = 64 << 20
STAGE_PIECE_DEFAULT = 4 << 20


def settings(env: Mapping[str, str]) -> tuple[int, int]:
    """(CUDA-IPC scratch bytes, staged piece bytes) from ``AIOCCL_GPU_SCRATCH`` / ``AIOCCL_GPU_STAGE_PIECE``."""
    return (env_int(env, "AIOCCL_GPU_SCRATCH", SCRATCH_DEFAULT, 4096),
            env_int(env, "AIOCCL_GPU_STAGE_PIECE", STAGE_PIECE_DEFAULT, 4096))
