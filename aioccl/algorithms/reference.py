"""Run the schedules of all ranks in one process, with numpy, no I/O.

This is the algorithms' test bench: it checks that every transfer fits its
buffers, that sends and receives pair up in size and order, that nothing
deadlocks, and it produces the outputs to compare with a plain numpy
reduction. It follows the round contract of :mod:`.schedule` exactly.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

from .schedule import Recv, RecvReduce, Region, Schedule


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
