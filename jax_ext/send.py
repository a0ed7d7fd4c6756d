"""``send``: hand ``x`` to member ``dest`` (process-level, or along mesh axes); matched by (peer, tag).

Forward-mode differentiable (the tangent follows the value, in order).
Reverse mode cannot work per rank: the receiver's cotangent would have to
flow back to a sender that JAX sees as having no output; use ``sendrecv``
or ``ppermute``, which are transposable.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aioccl import Communicator

from . import _compat
from ._primitive import Group, as_array, check_dtype, check_int, def_batching, define, group_for, varying_in

REVERSE_MODE = ("jax_ext: {api} has no reverse-mode derivative (jax.grad, jax.vjp): a receiver's cotangent "
                "cannot reach a sender with no outputs. Use jax_ext.sendrecv or jax_ext.ppermute, which are "
                "their own transposes, or forward mode (jax.jvp)")


def _abstract(x: Any, pos: Any, *, group: Group, dest: int, tag: int) -> list[Any]:
    check_dtype("send", x.dtype)
    return []


def _run(comm: Communicator, ins: list[np.ndarray], outs: list[np.ndarray], same: bool, *,
         dest: int, tag: int) -> None:
    comm.isend(ins[0], dest, tag).wait()


send_p = define("send", abstract=_abstract, run=_run, multiple_results=True,
                pair=lambda *, rank, dest, tag: (dest, -1, tag))
def_batching(send_p, axis0=False)


def _jvp(primals: Any, tangents: Any, **params: Any) -> Any:
    x, pos = primals
    send_p.bind(x, pos, **params)
    send_p.bind(_compat.instantiate_zeros(tangents[0]), pos, **params)
    return [], []


def _no_reverse(*args: Any, **params: Any) -> Any:
    raise NotImplementedError(REVERSE_MODE.format(api="send"))


_compat.def_jvp(send_p, _jvp)
_compat.def_linearize(send_p, _no_reverse)


def check_peer(api: str, peer: int, n: int, name: str = "peer") -> int:
    if not 0 <= check_int(api, name, peer) < n:
        raise ValueError(f"{api}: {name} {peer} out of range for {n} members")
    return int(peer)


def check_tag(api: str, tag: int) -> int:
    if not 0 <= check_int(api, "tag", tag) < 2**61:
        raise ValueError(f"{api}: tag must be in [0, 2**61), got {tag}")
    return int(tag)


def send(x: Any, dest: int, tag: int = 0, *, axis_name: Any = None, comm: Communicator | None = None) -> None:
    """Send ``x`` to ``dest`` (a rank of ``comm``, or an index along ``axis_name`` inside shard_map)."""
    group, pos = group_for("send", axis_name, comm)
    send_p.bind(varying_in(group, as_array(x)), pos, group=group, dest=check_peer("send", dest, group.size, "dest"),
                tag=check_tag("send", tag))
