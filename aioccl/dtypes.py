"""Supported element types and reduction operators.

One table maps numpy dtypes to the one-byte codes that travel in frame
headers, so a receiver can tell a float32 all_reduce from an int32 one and
name the mismatch instead of reducing garbage.
"""

from __future__ import annotations

import enum
import sys

import numpy as np

from .errors import InvalidArgument

# bfloat16 is ml_dtypes', imported on first use only: ml_dtypes 0.7 costs half a second of CPU to import (it
# adds its ufunc loops one at a time, each a linear search of the loops before it), which every rank and
# every launcher would pay before its first op. No array can be bfloat16 before ml_dtypes is imported, so
# a check of a dtype asks whether it is loaded (`loaded_bfloat16`) and imports nothing.
_NAMES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32", "float64")
BFLOAT16_CODE = _NAMES.index("bfloat16") + 1  # 0 means "no dtype" (barrier, raw bytes)
_CODE: dict[np.dtype, int] = {np.dtype(name): i + 1 for i, name in enumerate(_NAMES) if name != "bfloat16"}
_BY_CODE: dict[int, np.dtype] = {code: dt for dt, code in _CODE.items()}


_bfloat16: np.dtype | None = None


def bfloat16() -> np.dtype:
    """ml_dtypes' bfloat16, importing ml_dtypes if nothing has yet (a peer sent bfloat16, a torch bfloat16
    tensor is viewed); registered with the codes on the way."""
    global _bfloat16
    if _bfloat16 is None:
        import ml_dtypes

        _bfloat16 = np.dtype(ml_dtypes.bfloat16)
        _CODE[_bfloat16] = BFLOAT16_CODE
        _BY_CODE[BFLOAT16_CODE] = _bfloat16
    return _bfloat16


def loaded_bfloat16() -> np.dtype | None:
    """bfloat16 if ml_dtypes is imported (else no array can have it), without importing anything."""
    if _bfloat16 is None and getattr(sys.modules.get("ml_dtypes"), "bfloat16", None) is None:
        return None
    return bfloat16()


def is_bfloat16(dt: np.dtype) -> bool:
    bf = loaded_bfloat16()
    return bf is not None and np.dtype(dt) == bf


def __getattr__(name: str) -> tuple[np.dtype, ...]:
    if name == "SUPPORTED_DTYPES":  # the public list names bfloat16 itself: ml_dtypes is imported for it
        bf = bfloat16()
        return tuple(bf if n == "bfloat16" else np.dtype(n) for n in _NAMES)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def dtype_code(dt: np.dtype) -> int:
    code = _CODE.get(dt)  # a dtype itself: no np.dtype() call on the per-op path
    if code is not None:
        return code
    dt = np.dtype(dt)
    code = _CODE.get(dt)
    if code is None and is_bfloat16(dt):
        code = BFLOAT16_CODE
    if code is None:
        raise InvalidArgument(f"unsupported dtype {dt.name}; supported: {', '.join(_NAMES)}")
    return code


def dtype_from_code(code: int) -> np.dtype | None:
    dt = _BY_CODE.get(code)
    if dt is None and code == BFLOAT16_CODE:
        return bfloat16()
    return dt


def is_float(dt: np.dtype) -> bool:
    return np.dtype(dt).kind == "f" or is_bfloat16(dt)


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
