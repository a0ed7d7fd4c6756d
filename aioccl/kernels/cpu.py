"""CPU reductions with numpy ufuncs writing into preallocated outputs (no temporaries)."""

from __future__ import annotations

import numpy as np

from ..dtypes import ReduceOp

UFUNCS = {
    ReduceOp.SUM: np.add,
    ReduceOp.AVG: np.add,  # summed like SUM, divided once at the end (see scale)
    ReduceOp.PROD: np.multiply,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
}


def combine(op: ReduceOp, dst: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """``dst = op(a, b)`` elementwise; ``dst`` may alias ``a``."""
    UFUNCS[op](a, b, out=dst)


def scale(op: ReduceOp, buf: np.ndarray, nranks: int) -> None:
    """Finish an average: divide the sum by the number of ranks, in place."""
    if op is ReduceOp.AVG and buf.size:
        np.divide(buf, nranks, out=buf, casting="unsafe")
