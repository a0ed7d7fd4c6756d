"""aioccl: asyncio-native collective communication.

    comm = await aioccl.init()          # from aioccl-run / torchrun / mpirun / srun
    y = await comm.all_reduce(x)        # every op returns an awaitable Work at once
"""

import sys as _sys
import typing as _typing

from . import error_file, gpu
from .bootstrap.unique_id import UniqueId
from .communicator import Communicator
from .dtypes import ReduceOp
from .errors import (
    AiocclError,
    BootstrapError,
    CollectiveMismatch,
    CollectiveTimeout,
    CommAborted,
    InvalidArgument,
    OpCancelled,
    OpMismatch,
    PeerLost,
)
from .group import Group
from .initialization import init, init_sync
from .p2p import ANY_SOURCE, ANY_TAG, MAX_TAG, Message, Status
from .work import Work

__version__ = "0.1.0"

if _typing.TYPE_CHECKING:
    from .dtypes import SUPPORTED_DTYPES


def __getattr__(name: str) -> object:
    if name == "SUPPORTED_DTYPES":  # it names ml_dtypes' bfloat16: imported when asked for (aioccl/dtypes.py)
        from . import dtypes

        return dtypes.SUPPORTED_DTYPES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


error_file.install()  # only under a launcher that asked for it (AIOCCL_ERROR_FILE)

if "torch.distributed" in _sys.modules:  # torch came first: backend="aioccl" from now on (else its entry point)
    from .interop.c10d import register as _register

    _register()

__all__ = [
    "ANY_SOURCE",
    "ANY_TAG",
    "MAX_TAG",
    "SUPPORTED_DTYPES",
    "AiocclError",
    "BootstrapError",
    "CollectiveMismatch",
    "CollectiveTimeout",
    "CommAborted",
    "OpCancelled",
    "Communicator",
    "Group",
    "InvalidArgument",
    "Message",
    "OpMismatch",
    "PeerLost",
    "ReduceOp",
    "Status",
    "UniqueId",
    "Work",
    "gpu",
    "init",
    "init_sync",
]
