"""Which algorithm, and how big a chunk, for one call.

A deliberately small rule set for the TCP transport: latency algorithms
(recursive doubling, binomial tree) below ``SMALL`` bytes, where the number of
steps dominates; bandwidth algorithms (ring, chain) above, where bytes per
link dominate. ``AIOCCL_ALGO`` overrides (``ring``, ``rd``, ``tree``,
``chain``, or per collective: ``all_reduce:ring,broadcast:tree``);
``AIOCCL_BUFFSIZE`` sets the chunk in bytes. Both are read once per
communicator, so one process can hold communicators with different settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .algorithms import ALGORITHMS
from .errors import InvalidArgument

SMALL = 64 * 1024
DEFAULT_BUFFSIZE = 4 * 1024 * 1024
_ALIASES = {"tree": {"all_reduce": "rd"}, "rd": {"reduce": "tree", "broadcast": "tree"}}


@dataclass(frozen=True)
class Tuning:
    buffsize: int = DEFAULT_BUFFSIZE
    forced: tuple[tuple[str, str], ...] = ()  # (collective or "*", algorithm)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Tuning:
        buffsize = DEFAULT_BUFFSIZE
        if env.get("AIOCCL_BUFFSIZE"):
            try:
                buffsize = int(env["AIOCCL_BUFFSIZE"])
            except ValueError:
                raise InvalidArgument(f"AIOCCL_BUFFSIZE={env['AIOCCL_BUFFSIZE']!r} is not an integer") from None
            if buffsize < 64:
                raise InvalidArgument("AIOCCL_BUFFSIZE must be at least 64 bytes")
        forced = []
        for item in filter(None, (s.strip() for s in env.get("AIOCCL_ALGO", "").split(","))):
            coll, _, algo = item.rpartition(":")
            forced.append((coll or "*", algo.lower()))
        return cls(buffsize, tuple(forced))

    def choose(self, coll: str, nbytes: int, itemsize: int) -> tuple[str, int]:
        """(algorithm, chunk in elements) for one call."""
        choices = ALGORITHMS[coll]
        algo = choices[-1] if nbytes <= SMALL else choices[0]
        for which, want in self.forced:
            if which in ("*", coll):
                want = _ALIASES.get(want, {}).get(coll, want)
                if want in choices:
                    algo = want
        return algo, max(1, self.buffsize // max(1, itemsize))
