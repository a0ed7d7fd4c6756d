"""Hierarchical schedules for ranks on several hosts: inside each host, across hosts, inside again.

Why: between hosts the network is the slow link, and a flat ring over all
ranks sends ``2(n-1)/n`` of the buffer over it from every rank whose
neighbour is on another host. Going hierarchical, as NCCL's trees and rings
over nodes and Open MPI's ``coll/han`` do, crosses the network with a
fraction of that and leaves the rest to same-host pairs (shared memory).

Two shapes, chosen by the tuner (``aioccl.tuning``) from the cost model:

- ``rail``: every host has the same number of ranks L. A same-host
  reduce-scatter leaves local rank i with segment i of the host's sum; the
  ranks with local index i on every host (a *rail*, NCCL's term) all-reduce
  that segment across hosts; a same-host all-gather completes the buffer.
  Each rank crosses the network with ``1/L`` of the data, all rails at once
  (through one NIC a host then sends ``2(H-1)/H`` of the buffer for H hosts,
  against the flat ring's ``2(n-1)/n``). all_gather and reduce_scatter go the
  same way with each rank's block: across the rail, then inside the host (or
  the reverse); reduce_scatter keeps the host's partial sums in scratch, as
  much as its input (the tuner leaves it to the flat ring above
  ``HIER_SCRATCH_MAX``).
- ``leader``: one rank per host (local index 0, or the root on the root's
  host) crosses the network: reduce (or gather) to it inside the host, the
  leaders run the flat algorithm among themselves, then it broadcasts (or
  scatters) inside the host.
  Any layout (3+1+2 ranks), and the fewest messages for small buffers.

Each phase is an existing flat schedule (ring, doubling, tree, chain), built
for the phase's members and relabelled onto this communicator's ranks and
buffer regions (``relabel``), so the flat algorithms' own tests cover each
phase and ``reference.run`` checks the composition. Small buffers (at most
one chunk) use the latency algorithms in each phase, larger ones the
bandwidth ones: a pure rule, so that every rank picks the same.

``layout[r]`` is the host index of rank r; hosts are numbered by their first rank.
"""

from __future__ import annotations

from collections.abc import Callable

from . import doubling, ring, tree
from .schedule import IN, OUT, SCRATCH, Copy, Recv, RecvReduce, Region, Schedule, Send, Step, build, split

HIERARCHICAL = {"all_reduce": ("rail", "leader"), "broadcast": ("leader",), "reduce": ("leader",),
                "all_gather": ("rail", "leader"), "reduce_scatter": ("rail", "leader")}
HIER_SCRATCH_MAX = 64 << 20  # bytes of input above which a hierarchical reduce_scatter is not chosen (its scratch)
Where = dict[int, tuple[int, int]]  # a sub-schedule's buffer -> (this schedule's buffer, element offset)
SAME: Where = {IN: (IN, 0), OUT: (OUT, 0), SCRATCH: (SCRATCH, 0)}


def hosts_of(layout: tuple[int, ...]) -> list[list[int]]:
    """The ranks of each host, hosts in the order of their first rank."""
    hosts: dict[int, list[int]] = {}
    for r, h in enumerate(layout):
        hosts.setdefault(h, []).append(r)
    return list(hosts.values())


def numbered(layout: tuple[int, ...]) -> tuple[int, ...]:
    """The same layout with hosts numbered by their first rank (what the schedules index by)."""
    index: dict[int, int] = {}
    return tuple(index.setdefault(h, len(index)) for h in layout)


def spans_hosts(layout: tuple[int, ...]) -> bool:
    """Is a hierarchy worth having: several hosts, and some host with several ranks?"""
    hosts = hosts_of(layout)
    return len(hosts) > 1 and max(map(len, hosts)) > 1


def uniform(layout: tuple[int, ...]) -> bool:
    """Every host has the same number of ranks (what ``rail`` needs)."""
    return len({len(g) for g in hosts_of(layout)}) == 1


def relabel(sched: Schedule | list[Step], members: list[int], where: Where = SAME) -> list[Step]:
    """Steps of a schedule made for ``len(members)`` ranks, talking to ``members[p]`` instead of p, with
    regions moved by ``where``. Its ``scale`` is dropped (the whole schedule scales once, at its end), and
    copies that land on themselves are dropped."""
    def at(x: Region) -> Region:
        buf, off = where[x.buf]
        return Region(buf, x.start + off, x.stop + off)

    out = []
    for s in (sched.steps if isinstance(sched, Schedule) else sched):
        assert not s.lockstep, "hierarchical phases are message schedules"
        recvs = tuple(Recv(members[t.peer], at(t.dst)) if isinstance(t, Recv)
                      else RecvReduce(members[t.peer], at(t.dst), at(t.src), at(t.tmp)) for t in s.recvs)
        copies = tuple(c for c in (Copy(at(c.src), at(c.dst)) for c in s.copies) if c.src != c.dst)
        step = Step(copies=copies, sends=tuple(Send(members[t.peer], at(t.src)) for t in s.sends), recvs=recvs)
        if step.copies or step.sends or step.recvs:
            out.append(step)
    return out


def _rail_all_reduce(count: int, rank: int, layout: tuple[int, ...], chunk: int) -> Schedule:
    hosts = hosts_of(layout)
    h = layout[rank]
    local, i = hosts[h], hosts[h].index(rank)
    n_local, rail = len(local), [g[i] for g in hosts]
    segs = split(count, n_local)
    longest = max(b - a for a, b in segs)
    steps: list[Step] = [] if n_local > 1 else [Step(copies=(Copy(Region(IN, 0, count), Region(OUT, 0, count)),))]
    piece_outs = []
    for lo in range(0, max(longest, 1), max(chunk, 1)) if n_local > 1 else ():
        ins = [Region(IN, a + min(lo, b - a), a + min(lo + chunk, b - a)) for a, b in segs]
        outs = [Region(OUT, x.start, x.stop) for x in ins]
        tmp = Region(SCRATCH, 0, max(x.count for x in ins))
        steps += relabel(ring._reduce_scatter_steps(ins, i, n_local, outs, tmp, shift=0), local)
        piece_outs.append(outs)
    a, b = segs[(i + 1) % n_local]  # the segment this rank holds the host's sum of
    across = (doubling.all_reduce(b - a, hosts.index(local), len(hosts)) if count <= chunk
              else ring.all_reduce(b - a, hosts.index(local), len(hosts), chunk))
    steps += relabel(across, rail, {IN: (OUT, a), OUT: (OUT, a), SCRATCH: (SCRATCH, 0)})
    for outs in piece_outs:
        steps += relabel(ring._all_gather_steps(outs, i, n_local, first_owned=1), local)
    scratch = max(min(longest, chunk) if n_local > 1 else 0, across.scratch)
    return build(steps, scratch=scratch, scale=(Region(OUT, 0, count),), algo="rail")


def _reduce_in(count: int, i: int, n: int, root: int, chunk: int) -> Schedule:
    return tree.reduce(count, i, n, root) if count <= chunk else ring.reduce(count, i, n, root, chunk)


def _broadcast_in(count: int, i: int, n: int, root: int, chunk: int) -> Schedule:
    return tree.broadcast(count, i, n, root) if count <= chunk else tree.broadcast_chain(count, i, n, root, chunk)


def _leaders(hosts: list[list[int]], root: int) -> list[int]:
    """One rank per host: the root on its own host, the first rank on the others."""
    return [root if root in g else g[0] for g in hosts]


def _leader_all_reduce(count: int, rank: int, layout: tuple[int, ...], chunk: int) -> Schedule:
    hosts = hosts_of(layout)
    local = hosts[layout[rank]]
    i, leaders = local.index(rank), _leaders(hosts, 0)
    up = _reduce_in(count, i, len(local), 0, chunk)  # the host's sum lands in the leader's OUT
    steps = relabel(up, local)
    scratch = up.scratch
    if i == 0:
        across = (doubling.all_reduce(count, leaders.index(rank), len(hosts)) if count <= chunk
                  else ring.all_reduce(count, leaders.index(rank), len(hosts), chunk))
        steps += relabel(across, leaders, {IN: (OUT, 0), OUT: (OUT, 0), SCRATCH: (SCRATCH, 0)})
        scratch = max(scratch, across.scratch)
    down = _broadcast_in(count, i, len(local), 0, chunk)
    steps += relabel(down, local, {IN: (OUT, 0), OUT: (OUT, 0), SCRATCH: (SCRATCH, 0)})
    return build(steps, scratch=max(scratch, down.scratch), scale=(Region(OUT, 0, count),), algo="leader")


def _leader_broadcast(count: int, rank: int, layout: tuple[int, ...], root: int, chunk: int) -> Schedule:
    hosts = hosts_of(layout)
    local, leaders = hosts[layout[rank]], _leaders(hosts, root)
    me = leaders[layout[rank]]
    steps: list[Step] = []
    if rank == me:  # the root's IN reaches every leader's OUT
        steps += relabel(_broadcast_in(count, leaders.index(rank), len(leaders), leaders.index(root), chunk), leaders)
    steps += relabel(_broadcast_in(count, local.index(rank), len(local), local.index(me), chunk), local,
                     {IN: (OUT, 0), OUT: (OUT, 0), SCRATCH: (SCRATCH, 0)})
    return Schedule(tuple(steps), algo="leader")


def _leader_reduce(count: int, rank: int, layout: tuple[int, ...], root: int, chunk: int) -> Schedule:
    """Non-root ranks keep partial sums in scratch only: their IN and OUT stay untouched."""
    hosts = hosts_of(layout)
    local, leaders = hosts[layout[rank]], _leaders(hosts, root)
    me = leaders[layout[rank]]
    up = _reduce_in(count, local.index(rank), len(local), local.index(me), chunk)
    if rank != me:
        return build(relabel(up, local), scratch=up.scratch, algo="leader")
    # the host's sum: the root's OUT, another leader's SCRATCH[0:count] (its own scratch after it)
    partial, base = ((OUT, 0), 0) if rank == root else ((SCRATCH, 0), count)
    steps = relabel(up, local, {IN: (IN, 0), OUT: partial, SCRATCH: (SCRATCH, base)})
    across = _reduce_in(count, leaders.index(rank), len(leaders), leaders.index(root), chunk)
    steps += relabel(across, leaders, {IN: partial, OUT: (OUT, 0), SCRATCH: (SCRATCH, base)})
    scale = (Region(OUT, 0, count),) if rank == root else ()
    return build(steps, scratch=base + max(up.scratch, across.scratch), scale=scale, algo="leader")


def _ring_gather_sets(sets: list[list[int]], me: int, members: list[int], at: Callable[[int], Region]) -> list[Step]:
    """Ring all-gather where member j starts with the blocks ``sets[j]`` (``at(block)``: where one lies)."""
    m = len(sets)
    left, right = members[(me - 1) % m], members[(me + 1) % m]
    return [Step(sends=tuple(Send(right, at(b)) for b in sets[(me - t) % m]),
                 recvs=tuple(Recv(left, at(b)) for b in sets[(me - t - 1) % m])) for t in range(m - 1)]


def _ring_reduce_sets(sets: list[list[int]], me: int, members: list[int], src: Callable[[int], Region],
                      dst: Callable[[int], Region], tmp_at: int) -> list[Step]:
    """Ring reduce-scatter where segment j is the blocks ``sets[j]``: member ``me`` ends with set ``me``
    reduced in ``dst``. At step t it sends set me-t-1 (from ``src`` at first, then from ``dst``) and
    reduces set me-t-2 as ``dst = op(src, incoming)``; ``dst`` may be ``src`` (accumulate in place)."""
    m = len(sets)
    left, right = members[(me - 1) % m], members[(me + 1) % m]
    steps = []
    for t in range(m - 1):
        recvs, off = [], tmp_at
        for b in sets[(me - t - 2) % m]:
            d = dst(b)
            recvs.append(RecvReduce(left, d, src(b), Region(SCRATCH, off, off + d.count)))
            off += d.count
        steps.append(Step(sends=tuple(Send(right, (src if t == 0 else dst)(b)) for b in sets[(me - t - 1) % m]),
                          recvs=tuple(recvs)))
    return steps


def _rail_all_gather(block: int, rank: int, layout: tuple[int, ...]) -> Schedule:
    hosts = hosts_of(layout)
    local = hosts[layout[rank]]
    i = local.index(rank)

    def at(b: int) -> Region:
        return Region(OUT, b * block, (b + 1) * block)

    steps = [Step(copies=(Copy(Region(IN, 0, block), at(rank)),))]
    steps += _ring_gather_sets([[g[i]] for g in hosts], hosts.index(local), [g[i] for g in hosts], at)
    steps += _ring_gather_sets([[g[j] for g in hosts] for j in range(len(local))], i, local, at)
    return Schedule(tuple(steps), algo="rail")


def _leader_all_gather(block: int, rank: int, layout: tuple[int, ...], chunk: int) -> Schedule:
    hosts = hosts_of(layout)
    local, leaders = hosts[layout[rank]], _leaders(hosts, 0)
    n, lead = len(layout), local[0]

    def at(b: int) -> Region:
        return Region(OUT, b * block, (b + 1) * block)

    if rank != lead:
        steps = [Step(sends=(Send(lead, Region(IN, 0, block)),))]
    else:
        steps = [Step(copies=(Copy(Region(IN, 0, block), at(rank)),),
                      recvs=tuple(Recv(m, at(m)) for m in local if m != rank))]
        steps += _ring_gather_sets(hosts, leaders.index(rank), leaders, at)
    down = _broadcast_in(n * block, local.index(rank), len(local), 0, chunk)
    steps += relabel(down, local, {IN: (OUT, 0), OUT: (OUT, 0), SCRATCH: (SCRATCH, 0)})
    return Schedule(tuple(steps), scratch=down.scratch, algo="leader")


def _rail_reduce_scatter(block: int, rank: int, layout: tuple[int, ...]) -> Schedule:
    """Host sums accumulate in scratch (a block per rank), so IN is only read."""
    hosts = hosts_of(layout)
    local, n = hosts[layout[rank]], len(layout)
    i, n_local, n_hosts = local.index(rank), len(local), len(hosts)

    def inp(b: int) -> Region:
        return Region(IN, b * block, (b + 1) * block)

    def acc(b: int) -> Region:
        return Region(SCRATCH, b * block, (b + 1) * block)

    tmp_at = n * block
    steps = _ring_reduce_sets([[g[j] for g in hosts] for j in range(n_local)], i, local, inp, acc, tmp_at)
    rail = [g[i] for g in hosts]
    steps += _ring_reduce_sets([[r] for r in rail], hosts.index(local), rail, acc if n_local > 1 else inp, acc,
                               tmp_at)
    mine = acc(rank) if n_local > 1 or n_hosts > 1 else inp(rank)
    steps.append(Step(copies=(Copy(mine, Region(OUT, 0, block)),)))
    tmp = (n_hosts if n_local > 1 else 1) * block
    return build(steps, scratch=tmp_at + tmp, scale=(Region(OUT, 0, block),), algo="rail")


def _leader_reduce_scatter(block: int, rank: int, layout: tuple[int, ...], chunk: int) -> Schedule:
    hosts = hosts_of(layout)
    local, leaders = hosts[layout[rank]], _leaders(hosts, 0)
    n, lead = len(layout), local[0]
    up = _reduce_in(n * block, local.index(rank), len(local), 0, chunk)
    if rank != lead:  # a partial sum in scratch, then my block from the leader
        steps = relabel(up, local) + [Step(recvs=(Recv(lead, Region(OUT, 0, block)),))]
        return build(steps, scratch=up.scratch, scale=(Region(OUT, 0, block),), algo="leader")

    def part(b: int) -> Region:  # the host's sum, then the whole job's for this host's blocks
        return Region(SCRATCH, b * block, (b + 1) * block)

    base = n * block
    steps = relabel(up, local, {IN: (IN, 0), OUT: (SCRATCH, 0), SCRATCH: (SCRATCH, base)})
    steps += _ring_reduce_sets(hosts, leaders.index(rank), leaders, part, part, base)
    steps.append(Step(copies=(Copy(part(rank), Region(OUT, 0, block)),),
                      sends=tuple(Send(m, part(m)) for m in local if m != rank)))
    tmp = max(map(len, hosts)) * block
    return build(steps, scratch=base + max(up.scratch, tmp), scale=(Region(OUT, 0, block),), algo="leader")


def plan(coll: str, count: int, rank: int, layout: tuple[int, ...], root: int, chunk: int, algo: str) -> Schedule:
    """This rank's hierarchical schedule (``algorithms.plan`` routes here for ``rail`` and ``leader``)."""
    if len(layout) <= rank:
        raise ValueError(f"{algo}: a layout of {len(layout)} ranks has no rank {rank}")
    layout = numbered(layout)
    if coll == "all_reduce" and algo == "rail":
        if not uniform(layout):
            raise ValueError("rail needs the same number of ranks on every host")
        return _rail_all_reduce(count, rank, layout, chunk)
    if coll == "all_reduce" and algo == "leader":
        return _leader_all_reduce(count, rank, layout, chunk)
    if coll == "broadcast" and algo == "leader":
        return _leader_broadcast(count, rank, layout, root, chunk)
    if coll == "reduce" and algo == "leader":
        return _leader_reduce(count, rank, layout, root, chunk)
    if coll in ("all_gather", "reduce_scatter") and algo == "rail":
        if not uniform(layout):
            raise ValueError("rail needs the same number of ranks on every host")
        return (_rail_all_gather if coll == "all_gather" else _rail_reduce_scatter)(count, rank, layout)
    if coll == "all_gather" and algo == "leader":
        return _leader_all_gather(count, rank, layout, chunk)
    if coll == "reduce_scatter" and algo == "leader":
        return _leader_reduce_scatter(count, rank, layout, chunk)
    raise ValueError(f"no hierarchical {algo!r} for {coll}")
