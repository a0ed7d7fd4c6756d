"""Zero-config entry points: ``await aioccl.init()`` and ``aioccl.init_sync()``."""

from __future__ import annotations

import os

from . import async_libs, environment, log
from .bootstrap.root import RootServer
from .bootstrap.unique_id import UniqueId
from .communicator import Communicator
from .envvars import check_timeout, env_timeout
from .errors import BootstrapError

_log = log.get("INIT")


def _prepare(timeout: float | None) -> tuple[UniqueId, environment.LaunchEnv, RootServer | None]:
    log.configure_from_env()
    timeout = env_timeout(os.environ) if timeout is None else check_timeout(timeout)
    env = environment.read(os.environ)
    log.set_rank(env.rank)
    if env.weak_secret:
        _log.warning("no AIOCCL_COMM_SECRET: the secret is derived from the job's identity, which keeps "
                     "jobs apart but does not authenticate peers; aioccl-run sets one")
    server = None
    if env.rank == 0:
        try:
            server = RootServer.bind("0.0.0.0" if env.host not in ("127.0.0.1", "localhost") else env.host,
                                     env.port, env.secret, timeout)
        except OSError as e:
            raise BootstrapError(f"rank 0 could not listen on port {env.port} for the root: {e}") from None
        server.start_thread()
    _log.info("rank %d/%d from %s environment, root %s:%d", env.rank, env.world_size, env.source, env.host,
              env.port)
    return UniqueId(env.host, env.port, env.secret), env, server


def _root_done(server: RootServer | None) -> None:
    """The root has answered everyone once the communicator exists; let it close its sockets."""
    if server is not None and server.thread is not None:
        server.thread.join(timeout=5.0)


async def init(timeout: float | None = None, *, engine: str = "auto") -> Communicator:
    """Form the world communicator from the launcher's environment (rank 0 hosts the root).

    Works under asyncio and trio; ``engine`` is as in [`Communicator.create`][aioccl.Communicator.create].
    """
    uid, env, server = _prepare(timeout)
    try:
        comm = await Communicator.create(uid, env.rank, env.world_size, timeout, engine=engine)
    except BaseException:  # cancelled or failed: the root gives its port back now, not at its deadline
        if server is not None:
            server.close()
        raise
    await async_libs.to_thread(lambda: _root_done(server))
    return comm


def init_sync(timeout: float | None = None) -> Communicator:
    """Blocking [`init`][aioccl.init]; the engine runs on a proxy thread, ops are waited with ``.wait()``."""
    uid, env, server = _prepare(timeout)
    try:
        comm = Communicator.create_sync(uid, env.rank, env.world_size, timeout)
    except BaseException:
        if server is not None:
            server.close()
        raise
    _root_done(server)
    return comm
