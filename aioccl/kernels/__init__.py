"""Reductions, one function per operator: numpy ufuncs on CPU (cupy kernels come with GPU support)."""

from .cpu import UFUNCS, combine, scale

__all__ = ["UFUNCS", "combine", "scale"]
