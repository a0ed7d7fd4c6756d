"""Reading numeric settings from the environment, with one kind of error for every knob."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .errors import InvalidArgument

DEFAULT_TIMEOUT = 300.0


def check_timeout(value: Any, what: str = "timeout") -> float:
    """A deadline in seconds, as every API that takes one accepts it: a finite number greater than 0.

    ``nan`` would never compare as passed, ``inf`` never passes, and a string is a typo: each is an
    ``InvalidArgument`` naming ``what``, never a wait without end or a ``TypeError`` later.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise InvalidArgument(f"{what} must be a number of seconds, got {type(value).__name__} {value!r}")
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise InvalidArgument(f"{what} must be a number of seconds, got {value!r}") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidArgument(f"{what} must be a finite number of seconds greater than 0, got {value!r}")
    return seconds


def env_timeout(env: Mapping[str, str]) -> float:
    """``AIOCCL_TIMEOUT``: the default deadline of the bootstrap and of every op."""
    return env_float(env, "AIOCCL_TIMEOUT", DEFAULT_TIMEOUT, low=0, exclusive=True, unit="seconds")


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
    when it is not a finite number or lies below ``low`` (or at it, with ``exclusive``)."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    of = f" of {unit}" if unit else ""
    try:
        value = float(raw)
    except ValueError:
        raise InvalidArgument(f"{name}={raw!r} is not a number{of}") from None
    if not math.isfinite(value):
        raise InvalidArgument(f"{name}={raw!r} is not a finite number{of}")
    if low is not None and (value <= low if exclusive else value < low):
        bound = f"greater than {low:g}" if exclusive else f"at least {low:g}"
        raise InvalidArgument(f"{name} must be {bound}{' ' + unit if unit else ''}, got {raw!r}")
    return value
