"""``group.monitored_barrier(timeout)``: Gloo's barrier that names the ranks that did not arrive.

torch's ``dist.monitored_barrier`` refuses every backend but Gloo, but the
group's own method is the backend's: torch's suite and users who hold a group
call it. It works as Gloo's: every other rank sends rank 0 a token and waits
for its answer; rank 0 takes the tokens in rank order under one deadline and
fails naming the first rank (or, with ``wait_all_ranks``, every rank) that
did not come, in Gloo's words, so code that matches them keeps working.

The messages are point-to-point on the group's own communicator, under tags
of their own (above any tag a c10d user can pass, one pair per call): a rank
that arrives after rank 0 gave up leaves its token to a tag nobody will
receive again, not to the next barrier.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import numpy as np
import torch.distributed as dist

from ...communicator import Communicator
from ...errors import AiocclError

BASE_TAG = 1 << 61  # torch's tags are C ints: far below


def monitored_barrier(comm: Communicator, call: int, timeout: float, wait_all_ranks: bool) -> None:
    """The ``call``-th monitored barrier of the group on ``comm`` (the same count on every rank)."""
    token, ack = BASE_TAG + 2 * call, BASE_TAG + 2 * call + 1
    me, n = comm.rank, comm.world_size
    if me != 0:
        try:
            comm.isend(np.ones(1, np.int8), 0, token, timeout=timeout).wait()
            comm.irecv(np.zeros(1, np.int8), 0, ack, timeout=timeout).wait()
        except AiocclError as e:
            raise dist.DistBackendError(f"Rank {me} successfully reached monitoredBarrier, but received errors while "
                                        f"waiting for send/recv from rank 0. Please check rank 0 logs for faulty "
                                        f"rank. ({e})") from e
        return
    ms = int(timeout * 1000)
    start = time.monotonic()
    recvs = {r: comm.irecv(np.zeros(1, np.int8), r, token, timeout=max(timeout, 1e-3)) for r in range(1, n)}
    done: list[int] = []
    failed: list[int] = []
    try:
        for r, w in recvs.items():
            left = timeout - (time.monotonic() - start)
            if left <= 0 and not wait_all_ranks:
                processed = (f"Successfully processed ranks: {', '.join(map(str, done))}" if done
                             else "No ranks successfully processed in monitoredBarrier.")
                raise dist.DistBackendError(f"Rank 0 timed out in monitoredBarrier after {ms} ms.\n{processed}")
            try:
                w.wait(timeout=max(left, 0.0) + 0.05)  # the receive's own deadline ends it first
                done.append(r)
            except (AiocclError, TimeoutError) as e:
                if not wait_all_ranks:
                    raise dist.DistBackendError(f"[Rank 0]: Rank {r} failed to pass monitoredBarrier in {ms} ms") from e
                failed.append(r)
        if failed:
            raise dist.DistBackendError(f"[Rank 0]: Ranks {', '.join(map(str, failed))} failed to pass "
                                        f"monitoredBarrier in {ms} ms")
    finally:
        for w in recvs.values():
            w.cancel()  # those not matched: a late token must not meet them
    for r in range(1, n):
        comm.isend(np.ones(1, np.int8), r, ack, timeout=timeout).wait()


def seconds(timeout: Any, default: float) -> float:
    """A ``timedelta`` (or None: the group's deadline) in seconds."""
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    return default if timeout is None else float(timeout)
