"""``aioccl-run``: start N ranks per node, prefix their output, fail fast.

    aioccl-run --nproc-per-node 4 train.py --lr 0.1
    aioccl-run --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 --nproc-per-node 8 -m pkg.main

Each child gets ``AIOCCL_RANK``, ``AIOCCL_WORLD_SIZE``, ``AIOCCL_LOCAL_RANK``,
``AIOCCL_LOCAL_WORLD_SIZE``, ``AIOCCL_COMM_ID`` and ``AIOCCL_COMM_SECRET``
(random on one node; on several nodes it must be the same everywhere: set
``AIOCCL_COMM_SECRET`` or ``--secret``). Every output line is prefixed with
``[rank r]``. SIGINT/SIGTERM are forwarded. When a rank exits non-zero or
is killed, the others are terminated (then killed after a grace period) and
the launcher exits with that rank's code, naming it. If the launcher itself
dies (even by SIGKILL), the kernel sends its ranks SIGTERM, so no rank
outlives it.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import functools
import os
import secrets
import signal
import sys

from .bootstrap.unique_id import free_port

GRACE = 5.0


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="aioccl-run", description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc-per-node", "--np", type=int, default=1, help="ranks on this node (default 1)")
    p.add_argument("--nnodes", type=int, default=1, help="number of nodes (default 1)")
    p.add_argument("--node-rank", type=int, default=0, help="this node's index (default 0)")
    p.add_argument("--master-addr", default=None, help="address of node 0 (default 127.0.0.1 on one node)")
    p.add_argument("--master-port", type=int, default=None, help="root port (default: a free port on one node)")
    p.add_argument("--secret", default=None, help="32 hex digits shared by all nodes (or AIOCCL_COMM_SECRET)")
    p.add_argument("--no-prefix", action="store_true", help="do not prefix output lines with the rank")
    p.add_argument("-m", dest="module", action="store_true", help="run the target as a module (python -m)")
    p.add_argument("target", help="script path, or module name with -m")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the target")
    ns = p.parse_args(argv)
    if ns.nproc_per_node < 1 or ns.nnodes < 1 or not 0 <= ns.node_rank < ns.nnodes:
        p.error("need --nproc-per-node >= 1, --nnodes >= 1 and 0 <= --node-rank < --nnodes")
    if ns.nnodes > 1 and (ns.master_addr is None or ns.master_port is None):
        p.error("--master-addr and --master-port are required with --nnodes > 1")
    return ns


def child_envs(ns: argparse.Namespace, base: dict[str, str]) -> list[dict[str, str]]:
    addr = ns.master_addr or "127.0.0.1"
    port = ns.master_port or free_port(addr)
    secret = ns.secret or base.get("AIOCCL_COMM_SECRET")
    if secret is None:
        if ns.nnodes > 1:
            raise SystemExit("aioccl-run: with several nodes, set AIOCCL_COMM_SECRET (or --secret) to the same "
                             "32 hex digits on every node")
        secret = secrets.token_hex(16)
    world = ns.nnodes * ns.nproc_per_node
    envs = []
    for local in range(ns.nproc_per_node):
        env = dict(base)
        env.update(AIOCCL_RANK=str(ns.node_rank * ns.nproc_per_node + local), AIOCCL_WORLD_SIZE=str(world),
                   AIOCCL_LOCAL_RANK=str(local), AIOCCL_LOCAL_WORLD_SIZE=str(ns.nproc_per_node),
                   AIOCCL_COMM_ID=f"{addr}:{port}", AIOCCL_COMM_SECRET=secret, PYTHONUNBUFFERED="1")
        envs.append(env)
    return envs


def _die_with_parent(parent: int) -> None:
    """In the child, before exec: SIGTERM when the launcher dies (Linux's PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        return  # not Linux: ranks are still stopped on every path the launcher survives
    if os.getppid() != parent:  # the launcher died before prctl took effect
        os._exit(143)


async def _pump(stream: asyncio.StreamReader, out: object, prefix: bytes) -> None:
    buf = out.buffer  # type: ignore[attr-defined]
    while line := await stream.readline():
        buf.write(prefix + line if prefix else line)
        buf.flush()


async def launch(ns: argparse.Namespace) -> int:
    cmd = [sys.executable, *(["-m"] if ns.module else []), ns.target, *ns.args]
    envs = child_envs(ns, dict(os.environ))
    procs, pumps = [], []
    for env in envs:
        rank = int(env["AIOCCL_RANK"])
        proc = await asyncio.create_subprocess_exec(*cmd, env=env, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE,
                                                    preexec_fn=functools.partial(_die_with_parent, os.getpid()))
        prefix = b"" if ns.no_prefix else f"[rank {rank}] ".encode()
        pumps += [asyncio.create_task(_pump(proc.stdout, sys.stdout, prefix)),  # type: ignore[arg-type]
                  asyncio.create_task(_pump(proc.stderr, sys.stderr, prefix))]  # type: ignore[arg-type]
        procs.append((rank, proc))

    loop = asyncio.get_running_loop()
    signalled: list[int] = []

    def forward(sig: int) -> None:
        signalled.append(sig)
        for _, p in procs:
            if p.returncode is None:
                p.send_signal(sig)
        if len(signalled) == 1:  # ranks that ignore it are terminated, then killed, after the grace period
            loop.call_later(GRACE, lambda: asyncio.ensure_future(_stop([q for _, q in procs if q.returncode is None])))

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, forward, sig)

    waits = {asyncio.create_task(p.wait()): (rank, p) for rank, p in procs}
    failed: tuple[int, int] | None = None
    pending = set(waits)
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            rank, p = waits[t]
            if p.returncode and failed is None and not signalled:
                failed = (rank, p.returncode)
                sys.stderr.write(f"aioccl-run: rank {rank} {_how(p.returncode)}; stopping the other ranks\n")
                sys.stderr.flush()
                await _stop([q for _, q in procs if q.returncode is None])
    await asyncio.gather(*pumps, return_exceptions=True)
    if failed is not None:
        rank, code = failed
        sys.stderr.write(f"aioccl-run: failed: rank {rank} {_how(code)}\n")
        return code if code > 0 else 128 - code
    if signalled:
        return 128 + signalled[0]
    return 0


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


async def _stop(procs: list[asyncio.subprocess.Process]) -> None:
    for p in procs:
        if p.returncode is None:
            p.terminate()
    try:
        async with asyncio.timeout(GRACE):
            await asyncio.gather(*(p.wait() for p in procs))
    except TimeoutError:
        for p in procs:
            if p.returncode is None:
                p.kill()
        await asyncio.gather(*(p.wait() for p in procs))


def main(argv: list[str] | None = None) -> None:
    ns = parse(sys.argv[1:] if argv is None else argv)
    sys.exit(asyncio.run(launch(ns)))


if __name__ == "__main__":
    main()
