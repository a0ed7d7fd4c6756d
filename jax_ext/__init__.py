"""aioccl collectives inside jitted JAX code: process-level (like mpi4jax) and mesh-level (like jax.lax).

    # across processes, under jit, grad and vmap
    y = jax_ext.all_reduce(x)
    # inside jax.shard_map: one aioccl rank per device
    y = jax_ext.psum(x, "data")

Every op is a JAX primitive with an *ordered* effect, lowered to XLA's
buffer callback: zero-copy, and run in program order on every device, so
XLA cannot reorder two collectives into a cross-rank deadlock. See
docs/jax.md.
"""

from aioccl import ANY_SOURCE, ANY_TAG

from .all_gather import all_gather
from .all_reduce import all_reduce, pmax, pmean, pmin, psum
from .all_to_all import all_to_all
from .barrier import barrier
from .broadcast import broadcast
from .call_log import get_logging, set_logging
from .gather import gather
from .native_call import error_cause
from .ppermute import ppermute
from .recv import Status, recv
from .reduce import reduce
from .reduce_scatter import psum_scatter, reduce_scatter
from .runtime import default_comm, device_comms, set_default_comm, shutdown
from .scan import scan
from .scatter import scatter
from .send import send
from .sendrecv import sendrecv

__all__ = [
    "ANY_SOURCE",
    "ANY_TAG",
    "Status",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "barrier",
    "broadcast",
    "default_comm",
    "device_comms",
    "error_cause",
    "gather",
    "get_logging",
    "pmax",
    "pmean",
    "pmin",
    "ppermute",
    "psum",
    "psum_scatter",
    "recv",
    "reduce",
    "reduce_scatter",
    "scan",
    "scatter",
    "send",
    "sendrecv",
    "set_default_comm",
    "set_logging",
    "shutdown",
]
