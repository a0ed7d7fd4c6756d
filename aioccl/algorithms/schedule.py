"""The one vocabulary of sans-io schedules, for every transport.

A schedule is what one rank does for one collective: a tuple of ``Step`` s
over three flat buffers (``IN``, ``OUT``, ``SCRATCH``), addressed in
*elements*. It is pure data: no sockets, no arrays, no loop. The engine's one
executor (``aioccl.engine.executor``) runs it over whatever transports the
pairs use; ``.reference`` runs the schedules of all ranks in-process for
tests; ``.cost`` prices them.

A step can say two kinds of things, and an algorithm uses either or both:

- **messages** (any pair: tcp, rdma, a shared-memory pair): ``Send``,
  ``Recv``, ``RecvReduce``. Messages between a pair of ranks are matched by
  their order: the k-th send from a to b in a's schedule (steps in order, ops
  in listed order) is the k-th receive from a in b's schedule.
- **shared memory** (a communicator whose ranks share a host, ``lockstep``
  steps): ``Stage`` my regions into my slot, publish my step counter, wait
  for the ranks in ``wait`` to publish theirs, then ``Fetch`` or ``Reduce``
  straight out of their slots (or their registered buffers).

The executor's contract, in this order, for each step:

1. ``copies``, in order;
2. a lockstep step: ``stage`` (into slot half ``s % 2``, once every peer has
   published step ``s - 1``, so nobody still reads it), then publish ``s``;
3. ``sends`` and ``recvs`` run concurrently;
4. a lockstep step: wait until the ranks in ``wait`` have published ``s``;
   the first lockstep step of an op waits for all ranks and checks that all
   issued the same op;
5. once *all* receives have arrived, each ``RecvReduce`` applies
   ``dst = op(src, incoming)`` in order (so a region may be sent and reduced
   into in the same step without a race); then each read, in order. (An
   executor may apply a ``RecvReduce`` as soon as its own message is in, once
   the step's sends are out, when no later receive of the step lands in what
   it reads or writes: the result is the same, and the reduction overlaps
   the arrival of the rest.)
6. ``scale`` regions are divided by the number of ranks (``avg`` only), or by the schedule's
   ``divisor`` where it sets one (a prefix average divides by the ranks it covers).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, cast

IN, OUT, SCRATCH = 0, 1, 2
BUFFER_NAMES = ("IN", "OUT", "SCRATCH")


@dataclass(frozen=True, slots=True)
class Region:
    buf: int
    start: int
    stop: int

    @property
    def count(self) -> int:
        return self.stop - self.start

    def __repr__(self) -> str:
        return f"{BUFFER_NAMES[self.buf]}[{self.start}:{self.stop}]"


# -- messages ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Send:
    peer: int
    src: Region


@dataclass(frozen=True, slots=True)
class Recv:
    peer: int
    dst: Region


@dataclass(frozen=True, slots=True)
class RecvReduce:
    """Receive into ``tmp`` (scratch), then ``dst = op(src, tmp)``."""

    peer: int
    dst: Region
    src: Region
    tmp: Region


@dataclass(frozen=True, slots=True)
class Copy:
    src: Region
    dst: Region


# -- shared memory -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Stage:
    """Copy my ``src`` into my slot at element ``slot``."""

    src: Region
    slot: int


@dataclass(frozen=True, slots=True)
class Src:
    """Rank ``rank``'s ``region``, which that rank staged at element ``slot`` of its slot."""

    rank: int
    region: Region
    slot: int


@dataclass(frozen=True, slots=True)
class Fetch:
    src: Src
    dst: Region


@dataclass(frozen=True, slots=True)
class Reduce:
    """``dst = op(srcs[0], srcs[1], ...)``, in this order on every rank (bit-identical results)."""

    srcs: tuple[Src, ...]
    dst: Region


@dataclass(frozen=True, slots=True)
class Step:
    copies: tuple[Copy, ...] = ()
    sends: tuple[Send, ...] = ()
    recvs: tuple[Recv | RecvReduce, ...] = ()
    stage: tuple[Stage, ...] = ()
    wait: tuple[int, ...] = ()  # peers whose published step I need (lockstep)
    reads: tuple[Fetch | Reduce, ...] = ()
    scale: tuple[Region, ...] = ()  # divided by nranks at the end of the step when the op is AVG
    lockstep: bool = False  # a shared-memory step: publishes my step counter


@dataclass(frozen=True, slots=True)
class Schedule:
    """One rank's part of one collective."""

    steps: tuple[Step, ...]
    scratch: int = 0  # elements of SCRATCH needed
    zero_copy: bool = True  # may peers read my registered IN/OUT where they lie (lockstep steps)?
    algo: str = ""
    divisor: int = 0  # what ``scale`` regions are divided by (avg): 0 means the number of ranks
    messages: bool = field(init=False, repr=False, compare=False)  # has sends or receives
    lockstep: bool = field(init=False, repr=False, compare=False)  # needs the shared-memory channel
    _early: tuple[int, ...] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "messages", any(s.sends or s.recvs for s in self.steps))
        object.__setattr__(self, "lockstep", any(s.lockstep for s in self.steps))

    @property
    def early(self) -> tuple[int, ...]:
        """Per step, how many of its leading receives may be reduced as each lands (``early_reductions``).
        Worked out on first use: quadratic in a step's receives, and the cost model plans thousands of
        schedules it never runs (4096 ranks: 45 of the tuner test's 86 s went here)."""
        if self._early is None:
            object.__setattr__(self, "_early", tuple(early_reductions(s) for s in self.steps))
        return cast("tuple[int, ...]", self._early)


def _overlap(a: Region, b: Region) -> bool:
    return a.buf == b.buf and a.start < b.stop and b.start < a.stop


def early_reductions(step: Step) -> int:
    """How many leading receives of ``step`` an executor may reduce as soon as each lands (once the
    step's sends are out), instead of after all have arrived: each must be a ``RecvReduce`` into whose
    destination, source and scratch no later receive of the step lands. Only steps with several
    receives gain anything, and lockstep steps keep the contract's order."""
    recvs = step.recvs
    if len(recvs) < 2 or step.lockstep:
        return 0
    for i, t in enumerate(recvs):
        if not (isinstance(t, RecvReduce) and reduces_early(t, recvs[i + 1:])):
            return i
    return len(recvs)


def reduces_early(t: RecvReduce, later: tuple[Recv | RecvReduce, ...]) -> bool:
    """May ``t`` be applied before the ``later`` receives of its step land? Only if none of them lands
    in what ``t`` reads or writes."""
    for u in later:
        into = u.dst if isinstance(u, Recv) else u.tmp
        if _overlap(into, t.dst) or _overlap(into, t.src) or _overlap(into, t.tmp):
            return False
    return True


def build(steps: list[Step] | tuple[Step, ...], *, scale: tuple[Region, ...] = (), **kw: Any) -> Schedule:
    """A schedule whose ``scale`` regions are divided by nranks after its last step (avg)."""
    steps = list(steps)
    if scale:
        if steps:
            steps[-1] = replace(steps[-1], scale=steps[-1].scale + scale)
        else:
            steps.append(Step(scale=scale))
    return Schedule(tuple(steps), **kw)


def split(count: int, parts: int) -> list[tuple[int, int]]:
    """Split ``range(count)`` into ``parts`` contiguous ranges differing by at most one."""
    base, extra = divmod(count, parts)
    out, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def pieces(count: int, piece: int) -> list[tuple[int, int]]:
    """Consecutive ranges of at most ``piece`` elements (one empty range for count 0)."""
    if count == 0:
        return [(0, 0)]
    piece = max(1, piece)
    return [(s, min(s + piece, count)) for s in range(0, count, piece)]
