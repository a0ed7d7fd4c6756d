"""A sparse COO tensor summed across a group as Gloo sums it (``dist.all_reduce`` of a sparse tensor).

Every rank's indices and values are gathered, each padded to the largest
count (known from a first gather of the counts), then coalesced: the sum
replaces the tensor in place. The first gather is waited for in the call,
since the second's size depends on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...communicator import Communicator
from ...errors import InvalidArgument
from ...work import Work


def sparse_allreduce(comm: Communicator, t: torch.Tensor, timeout: float) -> tuple[list[Work[Any]], Callable[[], None]]:
    """Start summing ``t`` over ``comm``: the gathers' works, and the finish that writes the sum into ``t``."""
    if t.device.type != "cpu":
        raise InvalidArgument(f"allreduce of a sparse tensor on {t.device}: CPU only")
    n = comm.world_size
    mine = t.coalesce()
    idx, val = mine.indices().contiguous(), mine.values().contiguous()
    counts = torch.zeros(n, dtype=torch.int64)
    comm.all_gather(torch.tensor([idx.shape[1]], dtype=torch.int64), out=counts, timeout=timeout).wait()
    most = int(counts.max())
    send_i = torch.zeros((idx.shape[0], most), dtype=torch.int64)
    send_i[:, :idx.shape[1]] = idx
    send_v = torch.zeros((most, *val.shape[1:]), dtype=val.dtype)
    send_v[:val.shape[0]] = val
    all_i = torch.empty((n, *send_i.shape), dtype=torch.int64)
    all_v = torch.empty((n, *send_v.shape), dtype=val.dtype)
    works = [comm.all_gather(send_i.reshape(-1), out=all_i.reshape(-1), timeout=timeout),
             comm.all_gather(send_v.reshape(-1), out=all_v.reshape(-1), timeout=timeout)]

    def finish() -> None:
        got = [int(c) for c in counts]
        total = torch.sparse_coo_tensor(torch.cat([all_i[r][:, :got[r]] for r in range(n)], dim=1),
                                        torch.cat([all_v[r][:got[r]] for r in range(n)]), t.shape)
        t.copy_(total.coalesce())

    return works, finish
