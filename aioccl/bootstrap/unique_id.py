"""The unique id: where the root listens, and the secret every connection must prove.

Printable as ``host:port/<32 hex digits>`` and parsed back by
``UniqueId.parse()``. Like ``ncclGetUniqueId``, ``UniqueId.new()`` also
starts the root (on a daemon thread) in the calling process, so the id is
immediately usable by every rank, including ones in this process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..errors import InvalidArgument

SECRET_BYTES = 16


@dataclass(frozen=True)
class UniqueId:
    host: str
    port: int
    secret: bytes = field(repr=False)
    # the root was listening when this id was handed over (a store's copy, published by the root's own
    # process after it bound): a refused connection then means the root is gone, not that it is starting
    root_up: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise InvalidArgument(f"port {self.port} out of range")
        if len(self.secret) != SECRET_BYTES:
            raise InvalidArgument(f"secret must be {SECRET_BYTES} bytes, got {len(self.secret)}")

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}/{self.secret.hex()}"

    @classmethod
    def parse(cls, text: str) -> UniqueId:
        """Read back ``str(uid)`` (``host:port/<32 hex>``); ``InvalidArgument`` if it is not one."""
        try:
            addr, _, secret = text.strip().rpartition("/")
            host, _, port = addr.rpartition(":")
            host = host[1:-1] if host.startswith("[") else host
            if not host:
                raise ValueError("no host")
            return cls(host, int(port), bytes.fromhex(secret))
        except (ValueError, InvalidArgument) as e:
            raise InvalidArgument(f"not a unique id: {text!r} (expected host:port/<32 hex>): {e}") from None

    @classmethod
    def new(cls, host: str | None = None, port: int = 0, secret: bytes | None = None) -> UniqueId:
        """Start a root server in this process and return its id (a random secret unless ``secret``)."""
        from .netif import default_advertised
        from .root import RootServer

        advertised = host or default_advertised(os.environ.get("AIOCCL_SOCKET_IFNAME"))
        secret = os.urandom(SECRET_BYTES) if secret is None else secret
        server = RootServer.bind("" if host is None else host, port, secret)
        server.start_thread()
        return cls(advertised, server.port, secret)

