"""Run the schedules of all ranks in one process, with numpy, no I/O.

This is the algorithms' test bench: it checks that every transfer fits its
buffers, that sends and receives pair up in size and order, that nothing
deadlocks, and it produces the outputs to compare with a plain numpy
reduction. It follows the round contract of ``.schedule`` exactly.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable

import numpy as np

from .schedule import SCRATCH, Recv, RecvReduce, Region, Schedule
from .shm import Fetch, ShmSchedule, Src


class ScheduleError(AssertionError):
    """A schedule broke the contract (bounds, pairing, deadlock)."""


def run(
    schedules: list[Schedule],
    inputs: list[np.ndarray],
    outputs: list[np.ndarray],
    combine: Callable[[np.ndarray, np.ndarray, np.ndarray], None] = lambda d, a, b: np.add(a, b, out=d),
    in_place: bool = False,
) -> None:
    """Execute ``schedules[r]`` for every rank r; ``outputs`` are written in place."""
    n = len(schedules)
    bufs = []
    for r in range(n):
        scratch = np.full(schedules[r].scratch, -999, dtype=outputs[r].dtype)
        bufs.append((outputs[r] if in_place else inputs[r], outputs[r], scratch))

    def view(r: int, reg: Region) -> np.ndarray:
        buf = bufs[r][reg.buf]
        if not (0 <= reg.start <= reg.stop <= buf.size):
            raise ScheduleError(f"rank {r}: {reg} out of bounds of a buffer of {buf.size}")
        return buf[reg.start:reg.stop]

    wires: dict[tuple[int, int], deque[np.ndarray]] = {}
    pos = [0] * n
    sent = [False] * n  # whether the current round's sends are on the wire
    while True:
        progressed = False
        for r in range(n):
            rounds = schedules[r].rounds
            if pos[r] == len(rounds):
                continue
            rnd = rounds[pos[r]]
            if not sent[r]:
                for c in rnd.copies:
                    view(r, c.dst)[...] = view(r, c.src)
                for s in rnd.sends:
                    if not 0 <= s.peer < n or s.peer == r:
                        raise ScheduleError(f"rank {r}: bad peer {s.peer}")
                    wires.setdefault((r, s.peer), deque()).append(view(r, s.src).copy())
                sent[r] = True
                progressed = True
            need: dict[int, int] = {}
            for t in rnd.recvs:
                need[t.peer] = need.get(t.peer, 0) + 1
            if any(len(wires.get((p, r), ())) < k for p, k in need.items()):
                continue
            pending = []
            for t in rnd.recvs:
                msg = wires[(t.peer, r)].popleft()
                target = view(r, t.dst if isinstance(t, Recv) else t.tmp)
                if msg.size != target.size:
                    raise ScheduleError(f"rank {r}: {msg.size} elements from {t.peer} into {target.size}")
                target[...] = msg
                if isinstance(t, RecvReduce):
                    pending.append(t)
            for t in pending:
                combine(view(r, t.dst), view(r, t.src), view(r, t.tmp))
            pos[r] += 1
            sent[r] = False
            progressed = True
        if all(pos[r] == len(schedules[r].rounds) for r in range(n)):
            break
        if not progressed:
            stuck = {r: pos[r] for r in range(n) if pos[r] < len(schedules[r].rounds)}
            raise ScheduleError(f"deadlock: ranks stuck at rounds {stuck}")
    leftovers = {k: len(v) for k, v in wires.items() if v}
    if leftovers:
        raise ScheduleError(f"messages never received: {leftovers}")
    for r in range(n):
        for reg in schedules[r].scale:
            view(r, reg)[...] = view(r, reg) / n


def run_shm(
    schedules: list[ShmSchedule],
    inputs: list[np.ndarray],
    outputs: list[np.ndarray],
    cap: int,
    ufunc: np.ufunc = np.add,
    in_place: bool = False,
    registered: tuple[bool, ...] = (),
    seed: int | None = None,
) -> None:
    """Execute every rank's shared-memory schedule in one process, in a random interleaving.

    Each rank is a state machine that may *stage and publish* step ``s`` only
    once all ranks have published ``s - 1``, and *read* once the ranks it reads
    have published ``s``, exactly the engine's rules; ``seed`` picks which
    enabled rank moves next (None: lockstep, in rank order). Staged data goes to
    per-rank slot halves that later steps really overwrite, and ranks marked
    ``registered`` expose their live IN/OUT instead of staging (when the
    schedule allows zero-copy), so a schedule that reads a slot or a buffer
    after its owner moved on produces wrong outputs.
    """
    rng = random.Random(seed)
    n = len(schedules)
    reg = tuple(registered) or (False,) * n
    bufs = []
    for r in range(n):
        scratch = np.full(schedules[r].scratch, -999, dtype=outputs[r].dtype)
        bufs.append((outputs[r] if in_place else inputs[r], outputs[r], scratch))
    slots = [np.full((2, cap), -777, dtype=outputs[0].dtype) for _ in range(n)]
    zero = [reg[r] and schedules[r].zero_copy for r in range(n)]
    if len({len(s.steps) for s in schedules}) != 1:
        raise ScheduleError(f"ranks disagree on the number of steps: {[len(s.steps) for s in schedules]}")
    total = len(schedules[0].steps) + (1 if any(zero) else 0)  # the trailing step of zero-copy ops
    published = [0] * n
    phase = [0] * n  # 0: stage+publish next step, 1: read the current one

    def view(r: int, region: Region) -> np.ndarray:
        buf = bufs[r][region.buf]
        if not (0 <= region.start <= region.stop <= buf.size):
            raise ScheduleError(f"rank {r}: {region} out of bounds of a buffer of {buf.size}")
        return buf[region.start:region.stop]

    def source(src: Src, i: int, reader: int) -> np.ndarray:
        region = src.region
        if src.rank == reader or (zero[src.rank] and region.buf != SCRATCH):
            return view(src.rank, region)
        for st in schedules[src.rank].steps[i].stage:
            if (st.src.buf == region.buf and st.src.start <= region.start and region.stop <= st.src.stop
                    and st.slot + region.start - st.src.start == src.slot):
                staged: np.ndarray = slots[src.rank][(i + 1) & 1][src.slot:src.slot + region.count]
                return staged
        raise ScheduleError(f"rank {reader} reads {src} at step {i}, which rank {src.rank} did not stage there")

    def enabled(r: int) -> bool:
        i = published[r]  # steps published so far; the next is step i (0-based)
        if phase[r] == 0:
            stages = i >= len(schedules[r].steps) or bool(schedules[r].steps[i].stage)
            return all(published[j] >= i for j in range(n) if j != r) if (i == 0 or stages) else True
        wait = range(n) if i == 1 or i > len(schedules[r].steps) else schedules[r].steps[i - 1].wait
        return all(published[j] >= i for j in wait)

    def move(r: int) -> None:
        i = published[r]
        if phase[r] == 0:
            if i < len(schedules[r].steps):
                for st in schedules[r].steps[i].stage:
                    if st.slot < 0 or st.slot + st.src.count > cap:
                        raise ScheduleError(f"rank {r} step {i}: {st} does not fit a slot of {cap}")
                    if not zero[r] or st.src.buf == SCRATCH:
                        slots[r][(i + 1) & 1][st.slot:st.slot + st.src.count] = view(r, st.src)
            published[r] = i + 1
            phase[r] = 1
            return
        if i <= len(schedules[r].steps):
            step = schedules[r].steps[i - 1]
            for rd in step.reads:
                if isinstance(rd, Fetch):
                    view(r, rd.dst)[...] = source(rd.src, i - 1, r).copy()
                else:
                    arrs = [source(s, i - 1, r).copy() for s in rd.srcs]
                    acc = arrs[0]
                    for a in arrs[1:]:
                        acc = ufunc(acc, a)
                    view(r, rd.dst)[...] = acc
            for region in step.scale:
                view(r, region)[...] = view(r, region) / n
        phase[r] = 0

    while any(published[r] < total or phase[r] == 1 for r in range(n)):
        ready = [r for r in range(n) if (published[r] < total or phase[r] == 1) and enabled(r)]
        if not ready:
            raise ScheduleError(f"deadlock: published {published}, phases {phase}")
        move(ready[0] if seed is None else rng.choice(ready))
