"""An alpha-beta(-gamma) cost model that runs the engine's own schedules.

Each message costs ``alpha`` (latency plus software overhead) and ``beta``
seconds per byte; each reduced byte costs ``gamma``; each copied byte
``mem_beta``. A rank's sends in one step share its egress (they serialize at
``beta``), its receives share its ingress (an incast waits), and a step
follows the executor's contract: copies, then sends and receives, then the
reductions once all its transfers are done.

``simulate()`` is an exact discrete-event run of every rank's schedule
(for trees and recursive doubling at any size: few rounds per rank);
``lockstep()`` runs one rank's schedule as if all ranks moved in step,
which is exact for rank-symmetric schedules (ring, dissemination, recursive
doubling on powers of two; the tests prove it against ``simulate()``) and
lets the model reach thousands of ranks; the pipelined chain has an exact
recurrence; ring reduce beyond 64 ranks an upper bound.

Ranks on several hosts (``Hosts``): a message between two ranks of one host
takes the same-host link, any other the network link, each with its own
egress and ingress (shared memory and the NIC are separate resources). The
hierarchical ``rail`` schedule is rank-symmetric on a uniform layout
(lockstep again); ``leader`` beyond the simulated sizes is priced as its
three phases back to back.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache

from . import plan
from .hierarchy import HIERARCHICAL, hosts_of
from .schedule import RecvReduce, Schedule

DES_MAX_RANKS = 16  # beyond: lockstep for symmetric schedules
DES_MAX_RANKS_REDUCE = 64  # ring reduce: n^2 rounds to simulate; beyond, an upper bound


@dataclass(frozen=True)
class Link:
    name: str
    alpha: float  # seconds per message
    beta: float  # seconds per byte on the wire
    gamma: float = 1 / 8e9  # seconds per byte reduced
    mem_beta: float = 1 / 10e9  # seconds per byte copied locally
    description: str = ""


LINKS = {
    "same-host": Link("same-host", 2e-6, 1 / 10e9, description="shared memory between processes of one host"),
    "tcp": Link("tcp", 100e-6, 1 / 2.5e9, description="aioccl over TCP loopback today (fit to make demo)"),
    "25g": Link("25g", 10e-6, 1 / 3.125e9, description="25 Gb/s Ethernet, TCP (a kernel stack's latency)"),
    "100g": Link("100g", 5e-6, 1 / 12.5e9, description="100 Gb/s network"),
    "200g": Link("200g", 4e-6, 1 / 25e9, description="200 Gb/s network"),
    "400g": Link("400g", 3e-6, 1 / 50e9, description="400 Gb/s network"),
}


STREAM_RATE = 3.4e9  # bytes/s through one TCP stream, its copies on one core (benchmarks/socket_path.py)


def with_streams(link: Link, streams: int, rate: float = STREAM_RATE) -> Link:
    """``link`` as ``streams`` TCP streams per pair drive it (``AIOCCL_NSOCKS``): each stream's copies
    run on a core of their own and move at most ``rate``, so a NIC faster than one stream needs several
    (given the cores: one per stream per rank crossing the network at once)."""
    return replace(link, name=f"{link.name} x{streams}", beta=max(link.beta, 1 / (streams * rate)))


@dataclass(frozen=True)
class Hosts:
    """Where the ranks live: ``layout[r]`` is rank r's host; messages inside a host take ``local``; the
    ranks of a host share its ``nics`` network interfaces (local rank i uses NIC i % nics), so ranks that
    cross the network at once divide its bandwidth."""

    layout: tuple[int, ...]
    local: Link = LINKS["same-host"]
    nics: int = 1
    # each rank's index among its host's ranks, worked out once (hashing a 4096-rank layout per call of
    # ``nic`` for a cache lookup took 8 of the 4096-rank tuner test's 30 s)
    _local: tuple[int, ...] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_local", _local_index(self.layout))

    def link(self, net: Link, a: int, b: int) -> Link:
        return self.local if self.layout[a] == self.layout[b] else net

    def nic(self, r: int) -> tuple[str, int, int]:
        """The network port rank ``r`` sends and receives through (shared with its host's other ranks)."""
        return ("nic", self.layout[r], self._local[r] % self.nics)


@lru_cache(maxsize=64)
def _local_index(layout: tuple[int, ...]) -> tuple[int, ...]:
    seen: dict[int, int] = {}
    out = []
    for h in layout:
        out.append(seen.get(h, 0))
        seen[h] = out[-1] + 1
    return tuple(out)


def simulate(schedules: list[Schedule], link: Link, itemsize: int, hosts: Hosts | None = None) -> float:
    """Completion time of the slowest rank, every rank's schedule run event by event."""
    n = len(schedules)

    def via(a: int, b: int) -> Link:
        return link if hosts is None else hosts.link(link, a, b)

    pos = [0] * n
    start = [0.0] * n  # when the current round began
    posted = [False] * n
    sends_done = [0.0] * n
    egress: dict[tuple[object, ...], float] = {}  # (rank, link) or a host's NIC: when its sends are done
    ingress: dict[tuple[object, ...], float] = {}

    def port(r: int, lk: Link) -> tuple[object, ...]:
        return (r, lk.name) if hosts is None or lk is hosts.local else hosts.nic(r)

    wires: dict[tuple[int, int], deque[tuple[float, int]]] = {}
    work = deque(range(n))
    queued = [True] * n
    while work:
        r = work.popleft()
        queued[r] = False
        steps = schedules[r].steps
        while pos[r] < len(steps):
            rnd = steps[pos[r]]
            if not posted[r]:
                t0 = start[r] + sum(c.src.count for c in rnd.copies) * itemsize * link.mem_beta
                start[r] = t0
                done = t0
                for s in rnd.sends:
                    lk = via(r, s.peer)
                    key = port(r, lk)
                    tx = egress[key] = max(t0, egress.get(key, 0.0)) + s.src.count * itemsize * lk.beta
                    done = max(done, tx)
                    wires.setdefault((r, s.peer), deque()).append((tx + lk.alpha, s.src.count * itemsize))
                    if not queued[s.peer]:
                        queued[s.peer] = True
                        work.append(s.peer)
                sends_done[r] = done
                posted[r] = True
            need: dict[int, int] = {}
            for t in rnd.recvs:
                need[t.peer] = need.get(t.peer, 0) + 1
            if any(len(wires.get((p, r), ())) < k for p, k in need.items()):
                break
            end = max(start[r], sends_done[r])
            reduced = 0
            for t in rnd.recvs:
                arrive, nbytes = wires[(t.peer, r)].popleft()
                lk = via(t.peer, r)
                key = port(r, lk)
                got = ingress[key] = max(arrive, ingress.get(key, 0.0) + nbytes * lk.beta)
                end = max(end, got)
                if isinstance(t, RecvReduce):
                    reduced += t.tmp.count * itemsize
            start[r] = end + reduced * link.gamma
            posted[r] = False
            pos[r] += 1
    if any(pos[r] < len(schedules[r].steps) for r in range(n)):
        raise ValueError("the schedules deadlock")
    return max(start)


def lockstep(schedule: Schedule, link: Link, itemsize: int, rank: int = 0, hosts: Hosts | None = None,
             crowd: Sequence[tuple[int, int]] | None = None) -> float:
    """Rank ``rank``'s schedule with every peer in step: exact for rank-symmetric schedules.

    Ring segments differ by one element when the count does not divide by n;
    then the ranks' steps differ by that element and this is within a hair.
    ``crowd[s]``: how many ranks send, and receive, through this rank's NIC in step s (``nic_crowd``).
    """
    def via(peer: int) -> Link:
        return link if hosts is None else hosts.link(link, rank, peer)

    t = 0.0
    for i, rnd in enumerate(schedule.steps):
        t += sum(c.src.count for c in rnd.copies) * itemsize * link.mem_beta
        moved = 0.0
        for lk in {via(x.peer) for x in (*rnd.sends, *rnd.recvs)}:
            out, into = crowd[i] if crowd is not None and hosts is not None and lk is not hosts.local else (1, 1)
            tx = sum(s.src.count for s in rnd.sends if via(s.peer) is lk) * itemsize * lk.beta * out
            rx = sum(r.tmp.count if isinstance(r, RecvReduce) else r.dst.count
                     for r in rnd.recvs if via(r.peer) is lk) * itemsize * lk.beta * into
            has_tx, has_rx = any(via(s.peer) is lk for s in rnd.sends), any(via(r.peer) is lk for r in rnd.recvs)
            moved = max(moved, tx + lk.alpha if has_tx else 0.0, rx + lk.alpha if has_rx else 0.0)
        t += moved + sum(r.tmp.count for r in rnd.recvs if isinstance(r, RecvReduce)) * itemsize * link.gamma
    return t


@lru_cache(maxsize=256)  # the tuner prices each candidate again when it chooses: plans of 4096 ranks are dear
def nic_crowd(coll: str, algo: str, count: int, n: int, chunk: int, hosts: Hosts) -> tuple[tuple[int, int], ...]:
    """Per step of rank 0's schedule: the ranks on rank 0's NIC that send, and that receive, over the network in
    that step (at least 1 each), from their own schedules (a flat ring crosses from one rank of a host each
    way, rail and recursive doubling from all)."""
    if algo == "ring" and (coll, algo) in SYMMETRIC:
        return _ring_crowd(coll, count, n, chunk, hosts)
    if algo == "rail":
        return _rail_crowd(coll, count, n, chunk, hosts)
    layout = hosts.layout
    mates = _nic_mates(n, hosts)
    scheds = [plan(coll, count, r, n, 0, chunk, algo, layout=layout if algo in HIERARCHICAL_ALGOS else ())
              for r in mates]
    return _crowd(scheds, mates, layout)


def _nic_mates(n: int, hosts: Hosts) -> list[int]:
    """The ranks that send and receive through rank 0's NIC (rank 0 first)."""
    return [r for r in range(n) if hosts.nic(r) == hosts.nic(0)]


def _crowd(scheds: Sequence[Schedule], mates: Sequence[int], layout: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """``nic_crowd`` from the mates' own schedules (``scheds[i]`` is rank ``mates[i]``'s; the first is rank 0's)."""
    steps = len(scheds[0].steps)
    out, into = [0] * steps, [0] * steps
    for r, s in zip(mates, scheds, strict=True):
        for i, st in enumerate(s.steps[:steps]):
            out[i] += any(layout[x.peer] != layout[r] for x in st.sends)
            into[i] += any(layout[x.peer] != layout[r] for x in st.recvs)
    return tuple((max(1, a), max(1, b)) for a, b in zip(out, into, strict=True))


def _ring_crowd(coll: str, count: int, n: int, chunk: int, hosts: Hosts) -> tuple[tuple[int, int], ...]:
    """``nic_crowd`` of a flat ring without the mates' schedules (building 8 of 4096 ranks took most of the
    tuner's pricing there): in every step of a ring every rank sends to ``rank + 1`` and receives from
    ``rank - 1`` or does neither (all_gather's first step, its own copy), so rank 0's steps and the mates'
    neighbours say it all. Equal to ``_crowd`` (tests/test_sim.py checks it)."""
    layout = hosts.layout
    mates = _nic_mates(n, hosts)
    sending = max(1, sum(layout[(r + 1) % n] != layout[r] for r in mates))
    receiving = max(1, sum(layout[(r - 1) % n] != layout[r] for r in mates))
    return tuple((sending if st.sends else 1, receiving if st.recvs else 1)
                 for st in plan(coll, count, 0, n, 0, chunk, "ring").steps)


def _rail_crowd(coll: str, count: int, n: int, chunk: int, hosts: Hosts) -> tuple[tuple[int, int], ...]:
    """``nic_crowd`` of rail without the mates' schedules: rail needs equal hosts, and every rank of a host runs
    the same phases in the same steps (a ring inside the host, the ring of its rail across the hosts, inside
    again), so every mate crosses the network in the steps where rank 0 does and in no other. Equal to
    ``_crowd`` (tests/test_sim.py checks it)."""
    layout = hosts.layout
    mates = len(_nic_mates(n, hosts))
    own = plan(coll, count, 0, n, 0, chunk, "rail", layout=layout)
    return tuple((mates if any(layout[x.peer] != layout[0] for x in st.sends) else 1,
                  mates if any(layout[x.peer] != layout[0] for x in st.recvs) else 1) for st in own.steps)


def chain_time(count: int, n: int, chunk: int, link: Link, itemsize: int) -> float:
    """The pipelined chain broadcast, rank after rank: the same recurrence ``simulate()`` runs
    (the tests check they agree), in O(ranks x chunks) instead of building every schedule."""
    from .schedule import pieces

    sizes = [(b - a) * itemsize for a, b in pieces(count, chunk)]
    t = count * itemsize * link.mem_beta  # the root's copy into OUT
    egress, arrivals = 0.0, []
    for b in sizes:  # the root only sends: each round ends when its send has left
        t = max(t, egress) + b * link.beta
        egress = t
        arrivals.append(t + link.alpha)
    end = t
    for v in range(1, n):
        last = v == n - 1
        t = egress = ingress = 0.0
        forwarded = []
        for j in range(-1, len(sizes)):  # round: send chunk j (if any), receive chunk j+1 (if any)
            sends = j >= 0 and not last
            recvs = j + 1 < len(sizes)
            if not (sends or recvs):
                continue
            done = t
            if sends:
                egress = max(t, egress) + sizes[j] * link.beta
                forwarded.append(egress + link.alpha)
                done = egress
            if recvs:
                ingress = max(arrivals[j + 1], ingress + sizes[j + 1] * link.beta)
                done = max(done, ingress)
            t = done
        end = max(end, t)
        arrivals = forwarded
    return end


def ring_reduce_time(count: int, n: int, chunk: int, link: Link, itemsize: int) -> float:
    """Ring reduce = a symmetric reduce-scatter (lockstep of a non-root rank) + the root's incast.

    Each piece ends with n-1 segments converging on the root; its ingress
    serializes them, which a non-root rank's own schedule does not show.
    Exact for one piece; with several, the incast overlaps the next pieces'
    steps and this is an upper bound (by up to about a third; see the tests).
    """
    from .schedule import pieces, split

    t = lockstep(plan("reduce", count, 1, n, 0, chunk, "ring"), link, itemsize)
    for lo, hi in pieces(count, chunk * n):
        seg = max(b - a for a, b in split(hi - lo, n))
        t += (n - 2) * seg * itemsize * link.beta
    return t


HIERARCHICAL_ALGOS = {a for algos in HIERARCHICAL.values() for a in algos}

# schedules in which every rank does the same thing (recursive doubling too, when n is a power of two)
SYMMETRIC = {("all_reduce", "ring"), ("reduce_scatter", "ring"), ("all_gather", "ring"), ("barrier", "dissemination")}


@lru_cache(maxsize=8192)
def predict(coll: str, algo: str, count: int, n: int, link: Link, itemsize: int, chunk: int,
            hosts: Hosts | None = None) -> float:
    """Predicted seconds for one call; ``count`` as in ``aioccl.algorithms.plan()``; ``hosts``: ranks on
    several hosts (``link`` is then the network between them).

    Exact (the event simulation, or a form proven equal to it) everywhere
    except ring reduce beyond ``DES_MAX_RANKS_REDUCE`` ranks, where
    ``ring_reduce_time()`` is an upper bound, and ``leader`` beyond
    ``DES_MAX_RANKS``, priced as its phases back to back (an upper bound).
    """
    if n == 1:
        return count * itemsize * link.mem_beta
    layout = hosts.layout if hosts is not None else ()
    if algo in HIERARCHICAL_ALGOS:
        assert hosts is not None, f"{algo} needs the hosts"
        if n <= DES_MAX_RANKS:
            return simulate([plan(coll, count, r, n, 0, chunk, algo, layout=layout) for r in range(n)], link,
                            itemsize, hosts)
        if algo == "rail":
            crowd = nic_crowd(coll, algo, count, n, chunk, hosts)
            return lockstep(plan(coll, count, 0, n, 0, chunk, algo, layout=layout), link, itemsize, 0, hosts, crowd)
        return leader_time(coll, count, link, itemsize, chunk, hosts)
    symmetric = (coll, algo) in SYMMETRIC or ((coll, algo) == ("all_reduce", "rd") and n & (n - 1) == 0)
    if hosts is not None and n <= DES_MAX_RANKS:
        return simulate([plan(coll, count, r, n, 0, chunk, algo) for r in range(n)], link, itemsize, hosts)
    if symmetric and n > DES_MAX_RANKS:
        sharing = nic_crowd(coll, algo, count, n, chunk, hosts) if hosts is not None else None
        return lockstep(plan(coll, count, 0, n, 0, chunk, algo), link, itemsize, 0, hosts, sharing)
    if (coll, algo) == ("broadcast", "chain"):
        return chain_time(count, n, chunk, link, itemsize)
    if (coll, algo) == ("reduce", "ring") and n > DES_MAX_RANKS_REDUCE:
        return ring_reduce_time(count, n, chunk, link, itemsize)
    return simulate([plan(coll, count, r, n, 0, chunk, algo) for r in range(n)], link, itemsize)


def leader_time(coll: str, count: int, link: Link, itemsize: int, chunk: int, hosts: Hosts) -> float:
    """``leader`` as three phases back to back (inside the largest host, among the leaders, inside again):
    the schedules of each phase priced on their own link."""
    groups = hosts_of(hosts.layout)
    most, leaders, n = max(map(len, groups)), len(groups), len(hosts.layout)

    def inside(c: str, size: int) -> float:
        small = size <= chunk
        algo = {"reduce": "tree" if small else "ring", "broadcast": "tree" if small else "chain"}.get(c, "direct")
        return predict(c, algo, size, most, hosts.local, itemsize, chunk)

    def across(c: str, size: int) -> float:
        small = size <= chunk
        algo = {"all_reduce": "rd" if small else "ring", "reduce": "tree" if small else "ring",
                "broadcast": "tree" if small else "chain"}.get(c, "ring")
        return predict(c, algo, size, leaders, link, itemsize, chunk)

    if coll == "all_reduce":
        return inside("reduce", count) + across("all_reduce", count) + inside("broadcast", count)
    if coll == "all_gather":  # count: one rank's block
        return inside("gather", count) + across("all_gather", count * most) + inside("broadcast", count * n)
    if coll == "reduce_scatter":
        return inside("reduce", count * n) + across("reduce_scatter", count * most) + inside("scatter", count)
    return across(coll, count) + inside(coll, count)
