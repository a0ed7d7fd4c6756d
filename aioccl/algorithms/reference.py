"""Run the schedules of all ranks in one process, with numpy, no I/O.

This is the algorithms' test bench, for message and shared-memory steps
alike: it checks that every transfer fits its buffers, that sends and
receives pair up in size and order, that every rank reads only what its peer
staged for that step, that nothing deadlocks, and it produces the outputs to
compare with a plain numpy reduction. It follows the step contract of
``.schedule`` exactly.

Each rank is a state machine that *starts* a step (copies, stage, publish,
sends) and later *finishes* it (receives, reductions, reads, scale); ``seed``
picks which enabled rank moves next (None: in rank order), so a schedule
that relies on one particular interleaving fails here. Staged data goes to
per-rank slot halves that later steps really overwrite, and ranks marked
``registered`` expose their live IN/OUT instead of staging (when the
schedule allows zero-copy), so a schedule that reads a slot or a buffer
after its owner moved on produces wrong outputs.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence

import numpy as np

from .schedule import SCRATCH, Fetch, Recv, RecvReduce, Region, Schedule, Src, Step


class ScheduleError(AssertionError):
    """A schedule broke the contract (bounds, pairing, staging, deadlock)."""


def run(
    schedules: Sequence[Schedule],
    inputs: list[np.ndarray],
    outputs: list[np.ndarray],
    cap: int = 0,
    ufunc: np.ufunc = np.add,
    in_place: bool = False,
    registered: tuple[bool, ...] = (),
    seed: int | None = None,
) -> None:
    """Execute ``schedules[r]`` for every rank r; ``outputs`` are written in place. ``cap`` is the
    slot half in elements (for lockstep steps)."""
    rng = random.Random(seed)
    n = len(schedules)
    reg = tuple(registered) or (False,) * n
    bufs = []
    for r in range(n):
        scratch = np.full(schedules[r].scratch, -999, dtype=outputs[r].dtype)
        bufs.append((outputs[r] if in_place else inputs[r], outputs[r], scratch))
    slots = [np.full((2, max(cap, 1)), -777, dtype=outputs[0].dtype) for _ in range(n)]
    zero = [reg[r] and schedules[r].zero_copy for r in range(n)]
    steps = [list(s.steps) for s in schedules]
    locked = [[st for st in s if st.lockstep] for s in steps]
    if len({len(x) for x in locked}) != 1:
        raise ScheduleError(f"ranks disagree on the number of steps: {[len(x) for x in locked]}")
    if any(zero) and locked[0]:  # peers may read a registered buffer until all are done
        for r in range(n):
            steps[r].append(Step(wait=tuple(j for j in range(n) if j != r), lockstep=True))
            locked[r].append(steps[r][-1])
    everyone = [tuple(j for j in range(n) if j != r) for r in range(n)]
    wires: dict[tuple[int, int], deque[np.ndarray]] = {}
    pos = [0] * n
    started = [False] * n
    published = [0] * n  # lockstep steps published so far

    def view(r: int, region: Region) -> np.ndarray:
        buf = bufs[r][region.buf]
        if not (0 <= region.start <= region.stop <= buf.size):
            raise ScheduleError(f"rank {r}: {region} out of bounds of a buffer of {buf.size}")
        return buf[region.start:region.stop]

    def source(src: Src, s: int, reader: int) -> np.ndarray:
        region = src.region
        if src.rank == reader or (zero[src.rank] and region.buf != SCRATCH):
            return view(src.rank, region)
        for st in locked[src.rank][s - 1].stage:
            if (st.src.buf == region.buf and st.src.start <= region.start and region.stop <= st.src.stop
                    and st.slot + region.start - st.src.start == src.slot):
                staged: np.ndarray = slots[src.rank][s & 1][src.slot:src.slot + region.count]
                return staged
        raise ScheduleError(f"rank {reader} reads {src} at step {s}, which rank {src.rank} did not stage there")

    def enabled(r: int) -> bool:
        step = steps[r][pos[r]]
        s = published[r] + (0 if started[r] else 1)  # the lockstep number this step has (when it has one)
        if not started[r]:
            first = s == 1
            return not step.lockstep or not (step.stage or first) or all(published[j] >= s - 1 for j in everyone[r])
        need: dict[int, int] = {}
        for t in step.recvs:
            need[t.peer] = need.get(t.peer, 0) + 1
        if any(len(wires.get((p, r), ())) < k for p, k in need.items()):
            return False
        wait = everyone[r] if s == 1 else step.wait
        return not step.lockstep or all(published[j] >= s for j in wait)

    def start(r: int) -> None:
        step = steps[r][pos[r]]
        for c in step.copies:
            view(r, c.dst)[...] = view(r, c.src)
        if step.lockstep:
            half = (published[r] + 1) & 1
            for st in step.stage:
                if st.slot < 0 or st.slot + st.src.count > cap:
                    raise ScheduleError(f"rank {r} step {pos[r]}: {st} does not fit a slot of {cap}")
                if not zero[r] or st.src.buf == SCRATCH:
                    slots[r][half][st.slot:st.slot + st.src.count] = view(r, st.src)
            published[r] += 1
        for snd in step.sends:
            if not 0 <= snd.peer < n or snd.peer == r:
                raise ScheduleError(f"rank {r}: bad peer {snd.peer}")
            wires.setdefault((r, snd.peer), deque()).append(view(r, snd.src).copy())
        started[r] = True

    def finish(r: int) -> None:
        step = steps[r][pos[r]]
        for t in step.recvs:
            msg = wires[(t.peer, r)].popleft()
            target = view(r, t.dst if isinstance(t, Recv) else t.tmp)
            if msg.size != target.size:
                raise ScheduleError(f"rank {r}: {msg.size} elements from {t.peer} into {target.size}")
            target[...] = msg
        for t in step.recvs:
            if isinstance(t, RecvReduce):
                ufunc(view(r, t.src), view(r, t.tmp), out=view(r, t.dst))
        for rd in step.reads:
            if isinstance(rd, Fetch):
                view(r, rd.dst)[...] = source(rd.src, published[r], r).copy()
            else:
                arrs = [source(x, published[r], r).copy() for x in rd.srcs]
                acc = arrs[0]
                for a in arrs[1:]:
                    acc = ufunc(acc, a)
                view(r, rd.dst)[...] = acc
        for region in step.scale:
            view(r, region)[...] = view(r, region) / (schedules[r].divisor or n)
        pos[r] += 1
        started[r] = False

    while True:
        live = [r for r in range(n) if pos[r] < len(steps[r])]
        if not live:
            break
        ready = [r for r in live if enabled(r)]
        if not ready:
            raise ScheduleError(f"deadlock: ranks stuck at steps {({r: pos[r] for r in live})}, "
                                f"published {published}")
        r = ready[0] if seed is None else rng.choice(ready)
        if started[r]:
            finish(r)
        else:
            start(r)
    leftovers = {k: len(v) for k, v in wires.items() if v}
    if leftovers:
        raise ScheduleError(f"messages never received: {leftovers}")
