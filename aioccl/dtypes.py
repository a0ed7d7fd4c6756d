"""Supported element types and reduction operators.

One table maps numpy dtypes to the one-byte codes that travel in frame
headers, so a receiver can tell a float32 all_reduce from an int32 one and
name the mismatch instead of reducing garbage.
"""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np

from .errors import InvalidArgument

_DTYPES: list[np.dtype] = [
    np.dtype(np.int8),
    np.dtype(np.uint8),
    np.dtype(np.int32),
    np.dtype(np.uint32),
    np.dtype(np.int64),
    np.dtype(np.uint64),
    np.dtype(np.float16),
    np.dtype(ml_dtypes.bfloat16),
    np.dtype(np.float32),
    np.dtype(np.float64),
]
SUPPORTED_DTYPES: tuple[np.dtype, ...] = tuple(_DTYPES)
_CODE = {dt: i + 1 for i, dt in enumerate(_DTYPES)}  # 0 means "no dtype" (barrier, raw bytes)
_BY_CODE = {i + 1: dt for i, dt in enumerate(_DTYPES)}


def dtype_code(dt: np.dtype) -> int:
    code = _CODE.get(dt)  # a dtype itself: no np.dtype() call on the per-op path
    if code is not None:
        return code
    try:
        return _CODE[np.dtype(dt)]
    except KeyError:
        names = ", ".join(d.name for d in _DTYPES)
        raise InvalidArgument(f"unsupported dtype {np.dtype(dt).name}; supported: {names}") from None


def dtype_from_code(code: int) -> np.dtype | None:
    return _BY_CODE.get(code)


def is_float(dt: np.dtype) -> bool:
    return np.dtype(dt).kind == "f" or np.dtype(dt) == np.dtype(ml_dtypes.bfloat16)


class ReduceOp(enum.Enum):
    """Reduction operators; ``"sum"`` and ``ReduceOp.SUM`` are interchangeable."""

    SUM = "sum"
    """The sum over the ranks."""
    PROD = "prod"
    """The product over the ranks."""
    MIN = "min"
    """The smallest value; NaN wins, as in ``np.minimum``."""
    MAX = "max"
    """The largest value; NaN wins, as in ``np.maximum``."""
    AVG = "avg"
    """The sum divided by the number of ranks, once, at the end; floating-point dtypes only."""

    # members are singletons compared by identity: hash them by identity too, in C (Enum's own
    # __hash__ is Python code, and every op looks a reduction up in a dict or two)
    __hash__ = object.__hash__

    @classmethod
    def parse(cls, op: ReduceOp | str) -> ReduceOp:
        if isinstance(op, ReduceOp):
            return op
        if isinstance(op, str):
            found = _BY_NAME.get(op) or _BY_NAME.get(op.lower())
            if found is not None:
                return found
        names = ", ".join(repr(o.value) for o in cls)
        raise InvalidArgument(f"unknown reduction op {op!r}; expected one of {names}")

    @property
    def code(self) -> int:
        return _OP_CODES[self]


_OP_CODES = {op: i + 1 for i, op in enumerate(ReduceOp)}
_BY_NAME = {op.value: op for op in ReduceOp}


def check_op_dtype(op: ReduceOp, dt: np.dtype) -> None:
    """Reject pairs that have no exact meaning (integer average truncates silently)."""
    if op is ReduceOp.AVG and not is_float(dt):
        raise InvalidArgument(
            f"op 'avg' is not supported for integer dtype {np.dtype(dt).name}: use 'sum' and divide"
        )
