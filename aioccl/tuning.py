"""Which algorithm, and how big a chunk, for one call.

The tuner asks the cost model (``aioccl.algorithms.cost``) to run each
candidate's schedules for the size bucket of the call (the count rounded up
to a quarter octave), on the link model of the transport in use, and takes the
fastest; the answer is cached per (collective, bucket, ranks). This is the
same simulation ``aioccl-sim`` prints, and a test checks that the choice is
within 10% of the best simulated algorithm over a grid of sizes and ranks.

On shared memory (``Tuning.choose_shm()``) all_reduce and reduce use
``flat`` while bytes x ranks <= ``shm_flat_max(n)`` and ``direct`` above; the other
collectives have one same-host algorithm each, chunked by the slot size.

Overrides: ``AIOCCL_ALGO`` (``ring``, ``rd``, ``tree``, ``chain``, or per
collective ``all_reduce:ring,broadcast:tree``), ``AIOCCL_BUFFSIZE`` (chunk in
bytes), ``AIOCCL_TUNE_LINK`` (the link model; default ``tcp``). All are read
once per communicator.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from .algorithms import ALGORITHMS
from .algorithms.cost import LINKS, Hosts, Link, predict
from .algorithms.hierarchy import HIER_SCRATCH_MAX, HIERARCHICAL, spans_hosts, uniform
from .algorithms.shm import SHM_ALGORITHMS
from .errors import InvalidArgument

DEFAULT_BUFFSIZE = 4 * 1024 * 1024
# shared memory: while (bytes x ranks) stays below this, every rank reduces the whole buffer itself
# ("flat", one synchronisation); above, "direct" (reduce-scatter + all-gather) reads each byte once.
# Measured crossover (docs/benchmarks.md, "The flat crossover at 2 ranks"): at 4 ranks direct wins from
# 256 KiB; at 2 ranks flat wins to 8 MiB a rank (in place at every size: a flat in-place op stages, and
# staging a chunk that peers read from cache beats direct's process_vm_readv and its two more
# synchronisations; out of place to 8 MiB, where direct's single copy starts to pay).
SHM_FLAT_MAX = 512 * 1024
SHM_FLAT_MAX_2 = 16 << 20


def shm_flat_max(n: int) -> int:
    """bytes x ranks up to which ``flat`` runs a same-host all_reduce or reduce of ``n`` ranks."""
    return SHM_FLAT_MAX_2 if n == 2 else SHM_FLAT_MAX
_ALIASES = {"tree": {"all_reduce": "rd"}, "rd": {"reduce": "tree", "broadcast": "tree"}}


def _check_forced(coll: str, algo: str, raw: str) -> tuple[str, str]:
    """One ``AIOCCL_ALGO`` item, refused unless it names a collective and an algorithm that exist."""
    colls = [coll] if coll != "*" else list(ALGORITHMS)
    if coll != "*" and coll not in ALGORITHMS:
        raise InvalidArgument(f"AIOCCL_ALGO={raw!r}: no collective {coll!r}; one of {', '.join(ALGORITHMS)}")
    usable = {a for c in colls for a in (*ALGORITHMS[c], *SHM_ALGORITHMS.get(c, ()), *HIERARCHICAL.get(c, ()))}
    usable |= {a for a, per in _ALIASES.items() if any(c in per for c in colls)}
    if algo not in usable:
        where = f"for {coll}" if coll != "*" else "for any collective"
        raise InvalidArgument(f"AIOCCL_ALGO={raw!r}: no algorithm {algo!r} {where}; one of {', '.join(sorted(usable))}")
    return coll, algo


def bucket(count: int) -> int:
    """Round up to a quarter of an octave (1, 1.19, 1.41, 1.68 x a power of two): choices are
    cached per bucket, and a bucket is narrow enough to sit close to any crossover."""
    if count <= 8:
        return count
    high = count.bit_length() - 1  # 2**high <= count < 2**(high+1)
    for quarter in range(5):
        edge = int(2 ** (high + quarter / 4))
        if count <= edge:
            return edge
    return 1 << (high + 1)


def candidates(coll: str, layout: tuple[int, ...] = ()) -> tuple[str, ...]:
    """The algorithms that can run ``coll`` on ranks laid out on hosts as ``layout``."""
    if not spans_hosts(layout):
        return ALGORITHMS[coll]
    hier = tuple(a for a in HIERARCHICAL.get(coll, ()) if a != "rail" or uniform(layout))
    return ALGORITHMS[coll] + hier


def allowed(coll: str, count: int, n: int, itemsize: int, layout: tuple[int, ...] = ()) -> tuple[str, ...]:
    """``candidates`` for one call: a hierarchical reduce_scatter needs scratch as large as its input, so
    above ``HIER_SCRATCH_MAX`` bytes of input only the flat ones."""
    if coll == "reduce_scatter" and count * n * itemsize > HIER_SCRATCH_MAX:
        return ALGORITHMS[coll]
    return candidates(coll, layout)


@lru_cache(maxsize=4096)
def best(coll: str, count: int, n: int, link: Link, itemsize: int, chunk: int, layout: tuple[int, ...] = ()) -> str:
    choices = allowed(coll, count, n, itemsize, layout)
    if len(choices) == 1 or n == 1:
        return choices[0]
    hosts = Hosts(layout) if spans_hosts(layout) else None
    return min(choices, key=lambda a: predict(coll, a, count, n, link, itemsize, chunk, hosts))


@dataclass(frozen=True)
class Tuning:
    buffsize: int = DEFAULT_BUFFSIZE
    forced: tuple[tuple[str, str], ...] = ()  # (collective or "*", algorithm)
    link: Link = field(default=LINKS["tcp"])

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
            forced.append(_check_forced(coll.strip() or "*", algo.strip().lower(), env["AIOCCL_ALGO"]))
        name = env.get("AIOCCL_TUNE_LINK", "tcp")
        if name not in LINKS:
            raise InvalidArgument(f"AIOCCL_TUNE_LINK={name!r}; one of {', '.join(LINKS)}")
        return cls(buffsize, tuple(forced), LINKS[name])

    def agreed(self) -> dict[str, str]:
        """The settings every rank must share (they decide the schedules), compared at creation."""
        forced = ",".join(f"{c}:{a}" for c, a in self.forced) or "auto"
        link = next((k for k, v in LINKS.items() if v == self.link), "?")
        return {"AIOCCL_ALGO": forced, "AIOCCL_BUFFSIZE": str(self.buffsize), "AIOCCL_TUNE_LINK": link}

    def choose_shm(self, coll: str, count: int, itemsize: int, n: int) -> str | None:
        """The shared-memory algorithm for one call, or None when ``AIOCCL_ALGO`` forces a
        socket algorithm for this collective (useful to compare transports)."""
        choices = SHM_ALGORITHMS[coll]
        if not choices:  # a collective whose messages run over the pairs, whatever the transport
            return None
        algo = choices[0]
        if len(choices) > 1:
            algo = "flat" if count * itemsize * n <= shm_flat_max(n) else "direct"
        for which, want in self.forced:
            if which in ("*", coll):
                if want in choices:
                    algo = want
                elif _ALIASES.get(want, {}).get(coll, want) in ALGORITHMS[coll]:
                    return None
        return algo

    def chunk(self, itemsize: int) -> int:
        return max(1, self.buffsize // max(1, itemsize))

    def choose(self, coll: str, count: int, itemsize: int, n: int, layout: tuple[int, ...] = ()) -> tuple[str, int]:
        """(algorithm, chunk in elements) for one call of ``count`` elements on ``n`` ranks; ``layout``:
        each rank's host, when they are on several (the hierarchical algorithms then compete too)."""
        chunk = self.chunk(itemsize)
        algo = best(coll, bucket(count), n, self.link, itemsize, chunk, layout if spans_hosts(layout) else ())
        choices = candidates(coll, layout) if layout else ALGORITHMS[coll]
        for which, want in self.forced:
            if which in ("*", coll):
                want = _ALIASES.get(want, {}).get(coll, want)
                if want in choices:
                    algo = want
        return algo, chunk
