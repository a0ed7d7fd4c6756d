"""The staged path's host transfer: one GPU op's bytes moved as the same op on pinned host views.

Runs on the runner's private group (``owner.Owner.side``, a split of the user's communicator, so its
sequence numbers never mix with the user's), with the host engine choosing the transport and the
algorithm exactly as for host arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import ReduceOp


async def host_op(side: Any, name: str, rank: int, root: int, op: ReduceOp | None, hin: np.ndarray,
                  hout: np.ndarray, timeout: float) -> None:
    """The staged op's host transfer on the private communicator, on pinned host views."""
    o = op or ReduceOp.SUM
    is_root = rank == root
    if name == "all_reduce":
        await side.all_reduce(hin, o, out=hout, timeout=timeout)
    elif name == "reduce":
        await (side.reduce(hin, root, o, out=hout, timeout=timeout) if is_root
               else side.reduce(hin, root, o, timeout=timeout))
    elif name == "broadcast":
        await (side.broadcast(hin, root, out=hout, timeout=timeout) if is_root
               else side.broadcast(hout, root, timeout=timeout))
    elif name == "all_gather":
        await side.all_gather(hin, out=hout, timeout=timeout)
    elif name == "gather":
        await (side.gather(hin, root, out=hout, timeout=timeout) if is_root
               else side.gather(hin, root, timeout=timeout))
    elif name == "reduce_scatter":
        await side.reduce_scatter(hin, o, out=hout, timeout=timeout)
    elif name == "scatter":
        await (side.scatter(hin, root, out=hout, timeout=timeout) if is_root
               else side.scatter(None, root, out=hout, timeout=timeout))
    elif name == "all_to_all":
        await side.all_to_all(hin, out=hout, timeout=timeout)
    elif name == "scan":
        await side.scan(hin, o, out=hout, timeout=timeout)
    else:
        raise ValueError(f"no GPU host phase for {name!r}")
