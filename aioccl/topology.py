"""Where a communicator's ranks live and how they reach each other: hosts, ranks per host, transports.

Why: a job that is slow across hosts is first a question of shape (which
ranks share a host, which pairs went over shared memory, tcp or ib, and
whether collectives run on a same-host channel, flat, or hierarchically).
``Communicator.topology()`` answers it for this rank, ``AIOCCL_DEBUG=INFO``
logs it once per communicator, and ``aioccl-info --topology`` run under a
launcher prints every rank's view.
"""

from __future__ import annotations

from dataclasses import dataclass

from .algorithms.hierarchy import hosts_of, spans_hosts, uniform


@dataclass(frozen=True)
class Topology:
    """One rank's view of its communicator."""

    rank: int
    hosts: tuple[tuple[str, tuple[int, ...]], ...]  # (host identity, its ranks), hosts by first rank
    pairs: dict[int, str]  # peer -> "shm", "tcp", "tcp(3 streams)" (AIOCCL_NSOCKS) or "ib"
    collectives: str  # "shm channel", "flat", or "hierarchical (rail, leader)" / "(leader)"

    @property
    def per_host(self) -> tuple[int, ...]:
        return tuple(len(r) for _, r in self.hosts)

    def line(self) -> str:
        """The one-line summary logged at INFO."""
        counts: dict[str, int] = {}
        for kind in self.pairs.values():
            counts[kind] = counts.get(kind, 0) + 1
        pairs = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"
        hosts = " | ".join(f"{name}: {_ranks(r)}" for name, r in self.hosts)
        return (f"rank {self.rank}: topology {len(self.hosts)} host(s), ranks per host "
                f"{'x'.join(map(str, self.per_host))} [{hosts}]; my pairs: {pairs}; collectives {self.collectives}")


def _ranks(ranks: tuple[int, ...]) -> str:
    """``0-3,6``: consecutive runs folded."""
    out, start = [], ranks[0] if ranks else 0
    for i, r in enumerate(ranks):
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            out.append(f"{start}" if start == r else f"{start}-{r}")
            if i + 1 < len(ranks):
                start = ranks[i + 1]
    return ",".join(out)


def of(rank: int, layout: tuple[int, ...], names: list[str], on_channel: bool, pairs: dict[int, str]) -> Topology:
    """The topology a rank sees: ``layout`` (each rank's host index), the hosts' ``names``, whether its
    collectives run ``on_channel`` (a shared-memory channel), and its transport to each peer."""
    hosts = tuple((names[g[0]], tuple(g)) for g in hosts_of(layout))
    if on_channel:
        how = "on the shared-memory channel"
    elif spans_hosts(layout):
        how = "hierarchical where the tuner finds it faster (" + ("rail, leader" if uniform(layout) else "leader") + ")"
    else:
        how = "flat over the pairs"
    return Topology(rank, hosts, pairs, how)
