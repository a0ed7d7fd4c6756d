"""``aioccl-run``: start N ranks per node, prefix their output, fail fast (or keep going), name the cause.

    aioccl-run --nproc-per-node 4 train.py --lr 0.1
    aioccl-run --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 --nproc-per-node 8 -m pkg.main

torchrun's spellings work too (``--nproc_per_node auto``, ``--standalone``,
``--rdzv-endpoint host:port``, ``--node_rank`` ...), so a torchrun command line
runs unchanged. Each child gets ``AIOCCL_RANK``, ``AIOCCL_WORLD_SIZE``,
``AIOCCL_LOCAL_RANK``, ``AIOCCL_LOCAL_WORLD_SIZE``, ``AIOCCL_COMM_ID``,
``AIOCCL_COMM_SECRET`` (random on one node; on several nodes it must be the
same everywhere: set ``AIOCCL_COMM_SECRET`` or ``--secret``), and torchrun's
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT`` (for torch's own store; aioccl's root
listens on ``MASTER_PORT + 1``, as under torchrun's agent). Every output line
is prefixed with ``[rank r]``. Each rank runs in a session of its own (as
under torchrun: the kernel's autogroup scheduling shares CPU time between
sessions); SIGINT/SIGTERM are forwarded.

With more than one rank per node and ``OMP_NUM_THREADS`` unset, each rank
gets ``OMP_NUM_THREADS=1`` and the launcher says so once, as torchrun does:
torch (and numpy's BLAS) would otherwise start a thread per core in every
rank, and N ranks of N threads each on N cores fight for them (a 4-stage
torch pipeline on 2 cores: 17-26 s against 0.6-1.0 s with one thread).

When a rank fails (exits non-zero or is killed), the others are terminated
(then killed after a grace period), unless ``--keep-going``: then they run on,
which is what a program that calls ``comm.shrink()`` after a lost rank needs.
Either way the launcher exits with the first failure's code and names the rank
that failed *first* with its exception's last line, from the error file each
rank writes (``AIOCCL_ERROR_FILE``), not merely the first to exit. If the
launcher itself dies (even by SIGKILL), the kernel sends its ranks SIGTERM, so
no rank outlives it.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import functools
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass

from . import error_file
from .bootstrap.ports import PortTaken, Reservation, reserve

GRACE = 5.0


DEFAULT_MASTER_PORT = 29500  # as torchrun: the store listens here, the root one port up
SECRET_NEEDED = (
    "aioccl-run: with several nodes, every node needs the same secret, so that only this job's ranks can join "
    "it or open its data connections. Make one and give it to every node:\n"
    "    export AIOCCL_COMM_SECRET=$(python3 -c 'import secrets; print(secrets.token_hex(16))')\n"
    "then run aioccl-run with that variable set (or pass --secret <the same 32 hex digits>) on each node.")

def _nproc(text: str) -> int:
    """``--nproc-per-node``: a count, or torchrun's ``auto`` (one per GPU when there are GPUs, else per CPU)."""
    if text in ("auto", "gpu", "cpu"):
        gpus = _gpu_count() if text != "cpu" else 0
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return gpus or cpus
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', got {text!r}") from None


def _gpu_count() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    return len([d for d in os.listdir("/dev") if d.startswith("nvidia") and d[6:].isdigit()]) \
        if os.path.isdir("/dev") else 0


def _secret(text: str) -> str:
    try:
        ok = len(bytes.fromhex(text)) == 16
    except ValueError:
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError("must be 32 hex digits (16 bytes), e.g. from "
                                         "'python -c \"import secrets; print(secrets.token_hex(16))\"'")
    return text


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="aioccl-run", description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc-per-node", "--nproc_per_node", "--np", type=_nproc, default=1,
                   help="ranks on this node, or auto (one per GPU, else per CPU); default 1. With more than "
                        "one and OMP_NUM_THREADS unset, each rank gets OMP_NUM_THREADS=1, as under torchrun")
    p.add_argument("--nnodes", type=int, default=1, help="number of nodes (default 1)")
    p.add_argument("--node-rank", "--node_rank", type=int, default=0, help="this node's index (default 0)")
    p.add_argument("--master-addr", "--master_addr", default=None,
                   help="address of node 0 (default 127.0.0.1 on one node)")
    p.add_argument("--master-port", "--master_port", type=int, default=None,
                   help="torch's store port; aioccl's root uses the next one (default: free ports on one node)")
    p.add_argument("--rdzv-endpoint", "--rdzv_endpoint", default=None, metavar="HOST:PORT",
                   help="torchrun's spelling of --master-addr/--master-port")
    p.add_argument("--rdzv-backend", "--rdzv_backend", default=None, help="accepted for torchrun's c10d/static")
    p.add_argument("--rdzv-id", "--rdzv_id", default=None, help="accepted for torchrun compatibility")
    p.add_argument("--standalone", action="store_true", help="one node, free local ports (the default)")
    p.add_argument("--secret", type=_secret, default=None,
                   help="32 hex digits shared by all nodes (or AIOCCL_COMM_SECRET); make one with: "
                        "python3 -c 'import secrets; print(secrets.token_hex(16))'")
    p.add_argument("--keep-going", action="store_true",
                   help="when a rank fails, let the others run on (programs that shrink() and continue)")
    p.add_argument("--no-prefix", action="store_true", help="do not prefix output lines with the rank")
    p.add_argument("--bind-to", choices=("none", "core"), default="none",
                   help="core: each local rank on a core of its own, as mpirun binds by default (same-host ops "
                        "wait by spinning: two ranks the scheduler puts on one core wait for each other's "
                        "slices); none (the default, as torchrun): a rank's own threads may use every core")
    p.add_argument("-m", "--module", dest="module", action="store_true",
                   help="run the target as a module (python -m)")
    p.add_argument("--no-python", "--no_python", action="store_true",
                   help="run the target as a command, not a Python script (a target that is no file but a "
                        "command on PATH, such as aioccl-info, is run so anyway)")
    p.add_argument("target", help="script path, module name with -m, or a command on PATH")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the target")
    ns = p.parse_args(argv)
    if ns.rdzv_backend not in (None, "c10d", "static"):
        p.error(f"--rdzv-backend {ns.rdzv_backend}: aioccl-run rendezvous is static (c10d and static map to it)")
    if ns.rdzv_endpoint is not None:
        host, _, port = ns.rdzv_endpoint.rpartition(":")
        if not host or not port.isdigit():
            p.error(f"--rdzv-endpoint {ns.rdzv_endpoint!r} must be host:port")
        ns.master_addr, ns.master_port = ns.master_addr or host.strip("[]"), ns.master_port or int(port)
    if ns.standalone and ns.nnodes != 1:
        p.error("--standalone runs one node; drop --nnodes or --standalone")
    if ns.nproc_per_node < 1 or ns.nnodes < 1 or not 0 <= ns.node_rank < ns.nnodes:
        p.error("need --nproc-per-node >= 1, --nnodes >= 1 and 0 <= --node-rank < --nnodes")
    if ns.nnodes > 1 and ns.master_addr is None:
        p.error("--master-addr (or --rdzv-endpoint) is required with --nnodes > 1: node 0's address")
    if ns.nnodes > 1 and ns.master_port is None:
        ns.master_port = DEFAULT_MASTER_PORT  # torchrun's default
    env_secret = os.environ.get("AIOCCL_COMM_SECRET")
    if ns.secret is None and env_secret:
        try:
            _secret(env_secret)
        except argparse.ArgumentTypeError as e:
            p.error(f"AIOCCL_COMM_SECRET {e}")
    return ns


def reserve_ports(ns: argparse.Namespace) -> Reservation | None:
    """On the node that hosts them (node 0), hold torch's store port and aioccl's root port (the next one)
    for the job's life, so nothing else can take them before the ranks bind them (``bootstrap/ports.py``)."""
    if ns.node_rank != 0:
        return None
    what = "--master-port (torch's store; aioccl's root takes the next port)" if ns.master_port else "aioccl-run"
    try:
        return reserve("", ns.master_port or 0, count=2, what=what)
    except PortTaken as e:
        raise SystemExit(f"aioccl-run: {e}") from None


OMP_NOTICE = ("aioccl-run: setting OMP_NUM_THREADS=1 for each of the {n} ranks on this node (it was unset), "
              "so that their torch and BLAS threads do not oversubscribe the cores; set OMP_NUM_THREADS to "
              "tune it for your program")


def one_thread_each(ns: argparse.Namespace, base: dict[str, str]) -> bool:
    """torchrun's rule: several ranks on a node and ``OMP_NUM_THREADS`` unset: one intra-op thread each."""
    return ns.nproc_per_node > 1 and "OMP_NUM_THREADS" not in base


def child_envs(ns: argparse.Namespace, base: dict[str, str], error_dir: str | None = None,
               ports: Reservation | None = None) -> list[dict[str, str]]:
    addr = ns.master_addr or "127.0.0.1"
    store_port = ports.port if ports is not None else ns.master_port
    root_port = store_port + 1
    secret = ns.secret or base.get("AIOCCL_COMM_SECRET")
    if secret is None:
        if ns.nnodes > 1:
            raise SystemExit(SECRET_NEEDED)
        secret = secrets.token_hex(16)
    world = ns.nnodes * ns.nproc_per_node
    envs = []
    for local in range(ns.nproc_per_node):
        rank = ns.node_rank * ns.nproc_per_node + local
        env = dict(base)
        env.update(AIOCCL_RANK=str(rank), AIOCCL_WORLD_SIZE=str(world),
                   AIOCCL_LOCAL_RANK=str(local), AIOCCL_LOCAL_WORLD_SIZE=str(ns.nproc_per_node),
                   AIOCCL_COMM_ID=f"{addr}:{root_port}", AIOCCL_COMM_SECRET=secret, PYTHONUNBUFFERED="1",
                   RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local),
                   LOCAL_WORLD_SIZE=str(ns.nproc_per_node), GROUP_RANK=str(ns.node_rank),
                   MASTER_ADDR=addr, MASTER_PORT=str(store_port))
        if error_dir is not None:
            env["AIOCCL_ERROR_FILE"] = os.path.join(error_dir, f"rank{rank}.json")
        if one_thread_each(ns, base):
            env["OMP_NUM_THREADS"] = "1"
        envs.append(env)
    return envs


def _cores(bind_to: str, local_ranks: int) -> list[int] | None:
    """The core of each local rank for ``--bind-to core``, or None: not binding (asked not to, no affinity
    calls, or more local ranks than usable cores, which binding cannot give a core each: a note says so)."""
    if bind_to == "none" or not hasattr(os, "sched_getaffinity"):
        return None
    usable = sorted(os.sched_getaffinity(0))
    if local_ranks > len(usable):
        print(f"aioccl-run: --bind-to core: {local_ranks} ranks on {len(usable)} usable cores; not binding",
              file=sys.stderr)
        return None
    return usable[:local_ranks]


def _start_rank(parent: int, core: int | None) -> None:
    """In the child, before exec: die with the launcher, and sit on ``core`` when binding."""
    _die_with_parent(parent)
    if core is not None:
        os.sched_setaffinity(0, {core})


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


@dataclass
class Failure:
    rank: int
    code: int
    seen: float  # when the launcher saw it exit
    record: dict[str, object] | None = None  # its error file, when it wrote one

    @property
    def when(self) -> float:
        """When it failed: its exception's time if it raised, else when it was seen to exit."""
        t = self.record.get("time") if self.record else None
        return float(t) if isinstance(t, (int, float)) else self.seen

    def line(self) -> str:
        if self.record:
            return f"rank {self.rank} {_how(self.code)}: {self.record.get('type')}: {self.record.get('message')}"
        return f"rank {self.rank} {_how(self.code)}"


def _root_cause(failures: list[Failure]) -> Failure:
    """The earliest failure, unless it blames a peer that failed too (PeerLost): then that peer's.

    Error files are written when the exception reaches the top of a rank, which for the rank that
    raised first can be later than for a peer that noticed it had gone: the blame chain decides."""
    by_rank = {f.rank: f for f in failures}
    first = min(failures, key=lambda f: f.when)
    seen = {first.rank}
    while first.record is not None:
        culprit = first.record.get("culprit")
        if not isinstance(culprit, int) or culprit not in by_rank or culprit in seen:
            break
        first = by_rank[culprit]
        seen.add(culprit)
    return first


async def launch(ns: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="aioccl-run-") as error_dir:
        return await _launch(ns, error_dir)


async def _launch(ns: argparse.Namespace, error_dir: str) -> int:
    cmd = [sys.executable, *(["-m"] if ns.module else []), ns.target, *ns.args]
    if ns.no_python or (not ns.module and not os.path.exists(ns.target) and shutil.which(ns.target)):
        cmd = [ns.target, *ns.args]  # a command on PATH (aioccl-info, a console script): run it as it is
    ports = reserve_ports(ns)  # held until every rank has exited
    if one_thread_each(ns, dict(os.environ)):
        print(OMP_NOTICE.format(n=ns.nproc_per_node), file=sys.stderr, flush=True)
    try:
        return await _run_ranks(ns, cmd, child_envs(ns, dict(os.environ), error_dir, ports), error_dir)
    finally:
        if ports is not None:
            ports.close()


async def _run_ranks(ns: argparse.Namespace, cmd: list[str], envs: list[dict[str, str]], error_dir: str) -> int:
    procs: list[tuple[int, asyncio.subprocess.Process]] = []
    pumps = []
    loop = asyncio.get_running_loop()
    signalled: list[int] = []

    def forward(sig: int) -> None:
        signalled.append(sig)
        for _, p in procs:
            if p.returncode is None:
                p.send_signal(sig)
        if len(signalled) == 1:  # ranks that ignore it are terminated, then killed, after the grace period
            loop.call_later(GRACE, lambda: asyncio.ensure_future(_stop([q for _, q in procs if q.returncode is None])))

    for sig in (signal.SIGINT, signal.SIGTERM):  # before the first rank starts: a signal then is never lost
        loop.add_signal_handler(sig, forward, sig)
    cores = _cores(ns.bind_to, len(envs))
    for k, env in enumerate(envs):
        if signalled:  # stopped while starting: start no more
            break
        rank = int(env["AIOCCL_RANK"])
        start = functools.partial(_start_rank, os.getpid(), cores[k] if cores else None)
        # each rank in a session of its own, as torchrun starts them: with the kernel's autogroup scheduling
        # (sched_autogroup_enabled, the default on desktops and many servers) CPU time is shared fairly between
        # sessions, so N ranks in the launcher's one session would share one session's part of the machine
        # against each process beside them (a 4-stage pipeline beside two CPU-bound jobs: 8.0 s a step
        # against 4.2 s). Signals still reach them: the launcher forwards SIGINT and SIGTERM.
        proc = await asyncio.create_subprocess_exec(*cmd, env=env, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE, preexec_fn=start,
                                                    start_new_session=True)
        prefix = b"" if ns.no_prefix else f"[rank {rank}] ".encode()
        pumps += [asyncio.create_task(_pump(proc.stdout, sys.stdout, prefix)),  # type: ignore[arg-type]
                  asyncio.create_task(_pump(proc.stderr, sys.stderr, prefix))]  # type: ignore[arg-type]
        procs.append((rank, proc))
        if signalled:  # the signal came while this one was starting: it has to hear it too
            proc.send_signal(signalled[0])

    waits = {asyncio.create_task(p.wait()): (rank, p) for rank, p in procs}
    failures: list[Failure] = []
    stopping = False
    pending = set(waits)
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            rank, p = waits[t]
            stopped_by_us = stopping and p.returncode in (-signal.SIGTERM, -signal.SIGKILL)
            if p.returncode and not signalled and not stopped_by_us:  # a rank raising as we stop counts too
                failures.append(Failure(rank, p.returncode, time.time()))
                if len(failures) == 1:
                    what = "the others run on (--keep-going)" if ns.keep_going else "stopping the other ranks"
                    sys.stderr.write(f"aioccl-run: rank {rank} {_how(p.returncode)}; {what}\n")
                    sys.stderr.flush()
        if failures and not ns.keep_going and not stopping:
            stopping = True
            await asyncio.sleep(0.5)  # a rank that raised a moment ago finishes writing its error file
            await _stop([q for _, q in procs if q.returncode is None])
    await asyncio.gather(*pumps, return_exceptions=True)
    if failures:
        for f in failures:
            f.record = error_file.read(os.path.join(error_dir, f"rank{f.rank}.json"))
        first = _root_cause(failures)
        others = [f.line() for f in sorted(failures, key=lambda f: f.when) if f is not first]
        sys.stderr.write(f"aioccl-run: failed: first failure: {first.line()}\n")
        if others:
            sys.stderr.write("aioccl-run: then: " + "; ".join(others) + "\n")
        code = first.code
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
