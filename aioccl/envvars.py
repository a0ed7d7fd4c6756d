"""Reading numeric settings from the environment, with one kind of error for every knob."""

from __future__ import annotations

from collections.abc import Mapping

from .errors import InvalidArgument


def env_int(env: Mapping[str, str], name: str, default: int, low: int, high: int | None = None) -> int:
    """``int(env[name])``, or ``default`` when unset or empty; ``InvalidArgument`` naming the
    variable when it is not an integer or lies outside ``[low, high]``."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgument(f"{name}={raw!r} is not an integer") from None
    if value < low or (high is not None and value > high):
        bound = f"at least {low}" if high is None else f"within [{low}, {high}]"
        raise InvalidArgument(f"{name} must be {bound}, got {value}")
    return value


def env_float(env: Mapping[str, str], name: str, default: float, *, low: float | None = None,
              exclusive: bool = False, unit: str = "") -> float:
    """``float(env[name])``, or ``default`` when unset or empty; ``InvalidArgument`` naming the variable
    when it is not a number or lies below ``low`` (or at it, with ``exclusive``)."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    of = f" of {unit}" if unit else ""
    try:
        value = float(raw)
    except ValueError:
        raise InvalidArgument(f"{name}={raw!r} is not a number{of}") from None
    if low is not None and (value <= low if exclusive else value < low):
        bound = f"greater than {low:g}" if exclusive else f"at least {low:g}"
        raise InvalidArgument(f"{name} must be {bound}{' ' + unit if unit else ''}, got {raw!r}")
    return value
