"""aioccl on Ray (``pip install aioccl[ray]``): the ``"AIOCCL"`` backend of ``ray.util.collective``, and aioccl's
own awaitable communicators in actors. docs/ray.md says how to use both.

Importing this module registers the backend in the importing process: the driver and every actor import it
(or ``ray.init(runtime_env={"worker_process_setup_hook": "aioccl.ray.register"})`` does it in every worker).

    import aioccl.ray
    import ray.util.collective as col

    col.init_collective_group(world_size, rank, backend="AIOCCL", group_name="g")   # in each actor
    col.allreduce(tensor, group_name="g")

    comm = await aioccl.ray.init_group(world_size, rank, "g")                       # in an async actor
    await comm.all_reduce(x)
"""

from __future__ import annotations

from .backend import AiocclGroup, ReadOnlyArrayWarning, register
from .groups import BACKEND, create_group, init_group, init_group_sync

__all__ = ["BACKEND", "AiocclGroup", "ReadOnlyArrayWarning", "create_group", "init_group", "init_group_sync",
           "register"]

register()
