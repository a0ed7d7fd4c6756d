"""aioccl's errors as Ray's callers catch them: each one also a ``RuntimeError``.

``ray.util.collective``'s own CPU backend (GLOO) runs on torch.distributed, whose failures are
``RuntimeError`` s: a mismatched shape, dtype or list length, a timeout, a lost peer. Ray's users and Ray's
own tests catch ``RuntimeError``. aioccl's errors derive from the builtin closest to them instead
(``InvalidArgument`` is a ``ValueError``, ``CollectiveTimeout`` a ``TimeoutError``). In the ``"AIOCCL"``
backend's calls each is raised as its *Ray kind*: a subclass of that very class and of ``RuntimeError``,
with the same name, message and data (``op``, ``seq``, ``waiting_for``, ``rank``...), so
``except CollectiveTimeout``, ``except ValueError`` and ``except RuntimeError`` all catch it. aioccl's own
API raises the plain classes.

A Ray kind pickles as the aioccl class it derives from plus its data, so it crosses from an actor to the
driver (inside Ray's ``RayTaskError``) as itself.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import AiocclError

_kinds: dict[type[AiocclError], type[AiocclError]] = {}
_lock = threading.Lock()

F = TypeVar("F", bound=Callable[..., Any])


def ray_kind(cls: type[AiocclError]) -> type[AiocclError]:
    """``cls`` and ``RuntimeError`` in one class (``cls`` itself when it already is a ``RuntimeError``)."""
    if issubclass(cls, RuntimeError):
        return cls
    with _lock:
        kind = _kinds.get(cls)
        if kind is None:
            kind = _kinds[cls] = type(cls.__name__, (cls, RuntimeError), {
                "__module__": cls.__module__, "__qualname__": cls.__qualname__, "__reduce__": _reduce,
                "__doc__": f"{cls.__qualname__}, raised in a ray.util.collective call: also a RuntimeError."})
    return kind


def as_ray_error(e: AiocclError) -> AiocclError:
    """``e`` as its Ray kind: the same message, data, cause and traceback."""
    kind = ray_kind(type(e))
    if kind is type(e):
        return e
    new = _rebuild(type(e), e.args, dict(vars(e)))
    new.__cause__, new.__context__, new.__suppress_context__ = e.__cause__, e.__context__, e.__suppress_context__
    return new.with_traceback(e.__traceback__)


def raising_ray_kinds(fn: F) -> F:
    """A backend method whose aioccl errors leave it as their Ray kinds."""

    @functools.wraps(fn)
    def call(*args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except AiocclError as e:
            converted = as_ray_error(e)
            if converted is e:
                raise
            raise converted from e.__cause__

    return call  # type: ignore[return-value]


def _reduce(self: AiocclError) -> tuple[Any, ...]:
    return _rebuild, (type(self).__mro__[1], self.args, dict(vars(self)))  # the aioccl class, by reference


def _rebuild(cls: type[AiocclError], args: tuple[Any, ...], state: dict[str, Any]) -> AiocclError:
    kind = ray_kind(cls)
    e = kind.__new__(kind, *args)
    e.args = args
    vars(e).update(state)
    return e
