"""The table of collectives: every other list of them is derived from this one.

Adding a collective means a row here, its schedules (``algorithms/``) and its
method on the communicator (``collectives.py``); the wire codes, the error
texts, the tuner's candidates, the simulator, the GPU plans and the perf
tool read what they need from the row.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Collective:
    name: str
    code: int  # on the wire (frame headers, shared-memory descriptors, fingerprints): never renumber
    rooted: bool = False  # takes a root
    reduces: bool = False  # takes a reduction op
    blockwise: bool = False  # ``count`` is one rank's block, not the whole buffer
    input_blocks: bool = False  # rank j's part is block j of the input (reduce_scatter, scatter, all_to_all)
    root_input_only: bool = False  # only the root's input matters (broadcast, scatter)
    root_output_only: bool = False  # only the root gets output (reduce, gather)
    socket: tuple[str, ...] = ()  # algorithms over the pairs' messages (``plan()``)
    shm: tuple[str, ...] = ()  # algorithms over a shared-memory channel (``shm_plan()``)


TABLE: tuple[Collective, ...] = (
    Collective("all_reduce", 1, reduces=True, socket=("ring", "rd"), shm=("flat", "direct")),
    Collective("broadcast", 2, rooted=True, root_input_only=True, socket=("chain", "tree"), shm=("direct",)),
    Collective("reduce", 3, rooted=True, reduces=True, root_output_only=True, socket=("ring", "tree"),
               shm=("flat", "direct")),
    Collective("all_gather", 4, blockwise=True, socket=("ring",), shm=("direct",)),
    Collective("reduce_scatter", 5, reduces=True, blockwise=True, input_blocks=True, socket=("ring",),
               shm=("direct",)),
    Collective("gather", 6, rooted=True, blockwise=True, root_output_only=True, socket=("direct",), shm=("direct",)),
    Collective("scatter", 7, rooted=True, blockwise=True, input_blocks=True, root_input_only=True,
               socket=("direct",), shm=("direct",)),
    Collective("all_to_all", 8, blockwise=True, input_blocks=True, socket=("direct",), shm=("direct",)),
    Collective("barrier", 9, socket=("dissemination",), shm=("direct",)),
    # an inclusive prefix reduction (MPI_Scan): a chain of messages over the pairs, or on one host's channel
    # each rank folding ranks 0..r in rank order (the chain's order: the same bits)
    Collective("scan", 10, reduces=True, socket=("chain",), shm=("flat",)),
)
BY_NAME = {c.name: c for c in TABLE}
BY_CODE = {c.code: c for c in TABLE}


def name_of(code: int, default: str = "") -> str:
    """The collective with wire code ``code`` (``default`` or ``op <code>`` when none has it)."""
    c = BY_CODE.get(code)
    return c.name if c is not None else (default or f"op {code}")
