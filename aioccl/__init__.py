"""aioccl: asyncio-native collective communication.

    comm = await aioccl.init()          # from aioccl-run / torchrun / mpirun / srun
    y = await comm.all_reduce(x)        # every op returns an awaitable Work at once
"""

import importlib as _importlib
import sys as _sys
from typing import TYPE_CHECKING, Any

from . import error_file
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

__version__ = "0.1.0"

# The rest of the public names are loaded on first use (PEP 562): ``aioccl-run`` is ``python -m aioccl.run``,
# which imports this package before the launcher, and the launcher needs none of the communicator (its import,
# numpy's included, was two thirds of a launch's CPU). A rank loads them at its ``aioccl.init()``.
_LAZY = {
    "UniqueId": "bootstrap.unique_id", "Communicator": "communicator", "ReduceOp": "dtypes",
    "SUPPORTED_DTYPES": "dtypes", "Group": "group", "init": "initialization", "init_sync": "initialization",
    "ANY_SOURCE": "p2p", "ANY_TAG": "p2p", "MAX_TAG": "p2p", "Message": "p2p", "Status": "p2p", "Work": "work",
}

if TYPE_CHECKING:
    from . import gpu
    from .bootstrap.unique_id import UniqueId
    from .communicator import Communicator
    from .dtypes import SUPPORTED_DTYPES, ReduceOp
    from .group import Group
    from .initialization import init, init_sync
    from .p2p import ANY_SOURCE, ANY_TAG, MAX_TAG, Message, Status
    from .work import Work
else:
    def __getattr__(name: str) -> Any:
        where = _LAZY.get(name)
        if where is None:  # a subpackage (``aioccl.gpu``, ``aioccl.native``): an attribute once imported
            try:
                return _importlib.import_module(f".{name}", __name__)
            except ModuleNotFoundError as e:
                if e.name != f"{__name__}.{name}":
                    raise
                raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
        value = getattr(_importlib.import_module(f".{where}", __name__), name)
        globals()[name] = value  # the next look-up is a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})


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
