"""Every ``AIOCCL_*`` environment variable aioccl reads, with its default, in one table.

The modules that read a knob parse it themselves (next to the code it
steers); this table is what ``aioccl-info`` prints and what the tests hold
the code and ``docs/env.md`` to, so a new knob cannot go undocumented.
``check`` runs every knob's own parser: the communicator calls it before it sends a byte, and
``aioccl-info`` prints what it finds. Since it reaches every layer that reads a knob, this module
stands in the communicator's layer (docs/architecture.md), though its table imports nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Knob:
    name: str
    default: str  # as a user would write it; "unset" where absence means something
    group: str  # launch, behaviour, shm, ib, gpu, debug
    meaning: str


KNOBS: tuple[Knob, ...] = (
    Knob("AIOCCL_RANK", "unset", "launch", "this rank (set by aioccl-run)"),
    Knob("AIOCCL_WORLD_SIZE", "unset", "launch", "the number of ranks (set by aioccl-run)"),
    Knob("AIOCCL_LOCAL_RANK", "unset", "launch", "rank on this host (set by aioccl-run)"),
    Knob("AIOCCL_LOCAL_WORLD_SIZE", "unset", "launch", "ranks on this host (set by aioccl-run)"),
    Knob("AIOCCL_COMM_ID", "unset", "launch", "host:port of the root"),
    Knob("AIOCCL_COMM_SECRET", "unset", "launch", "32 hex digits every connection proves (never printed)"),
    Knob("AIOCCL_TIMEOUT", "300", "behaviour", "default deadline of bootstrap and every op, seconds"),
    Knob("AIOCCL_PEER_TIMEOUT", "10", "behaviour", "seconds without a peer's acknowledgement before PeerLost"),
    Knob("AIOCCL_WATCHDOG_S", "10", "behaviour", "an op waiting this long is logged, then again each interval; 0: off"),
    Knob("AIOCCL_ERROR_FILE", "unset", "launch", "where a rank writes its uncaught exception (set by aioccl-run)"),
    Knob("AIOCCL_FLIGHT_RECORDER", "64", "behaviour", "finished ops each communicator remembers"),
    Knob("AIOCCL_SOCKET_IFNAME", "unset", "behaviour", "interfaces to use (NCCL syntax); unset: route to root"),
    Knob("AIOCCL_HOSTID", "unset", "behaviour", "ranks with equal ids count as one host"),
    Knob("AIOCCL_ALGO", "auto", "behaviour", "force algorithms, e.g. ring, rail or all_reduce:ring,broadcast:tree"),
    Knob("AIOCCL_BUFFSIZE", "4194304", "behaviour", "chunk bytes of pipelined socket algorithms"),
    Knob("AIOCCL_TUNE_LINK", "tcp", "behaviour", "link model the tuner simulates"),
    Knob("AIOCCL_NSOCKS", "1", "behaviour", "TCP streams per pair of ranks on different hosts (1-16)"),
    Knob("AIOCCL_SHM_DISABLE", "0", "shm", "1: sockets even between ranks of one host"),
    Knob("AIOCCL_SHM_BUFFSIZE", "1048576", "shm", "bytes per staging slot half"),
    Knob("AIOCCL_NET_SPIN_US", "50", "p2p", "microseconds a p2p receive over TCP polls its socket first"),
    Knob("AIOCCL_P2P_EAGER", "1048576", "p2p", "largest point-to-point payload sent without a rendezvous"),
    Knob("AIOCCL_SEND_QUEUE", "4194304", "p2p", "per peer, bytes of queued sends past which comm.drain() waits"),
    Knob("AIOCCL_UNEXPECTED_BYTES", "67108864", "p2p", "per peer, bytes held for receives not posted yet"),
    Knob("AIOCCL_SHM_RING", "4194304", "shm", "bytes of each direction's FIFO between two same-host ranks"),
    Knob("AIOCCL_SHM_HEAP", "268435456", "shm", "bytes of registered-buffer heap per rank (comm.alloc)"),
    Knob("AIOCCL_SHM_SPIN_US", "100", "shm", "microseconds a waiting rank spins before it parks"),
    Knob("AIOCCL_SHM_STALL_MS", "20", "shm", "milliseconds a send to a full same-host FIFO waits for a receiver "
         "that takes nothing before it is put off (tried again from the loop)"),
    Knob("AIOCCL_LOOP_SLICE_US", "200", "engine", "longest run of a channel's steps before it hands the loop back"),
    Knob("AIOCCL_GIL_SWITCH_US", "200", "engine", "the interpreter's GIL switch interval a proxy thread sets, at most"),
    Knob("AIOCCL_SHM_YIELD", "1", "shm", "a spinning rank yields the CPU between looks (0: pure spin, for ranks "
         "pinned to cores of their own)"),
    Knob("AIOCCL_NATIVE", "1", "core", "0: every op takes the Python path, not the native core (A/B runs, debugging)"),
    Knob("AIOCCL_NATIVE_MAX_BYTES", str(1 << 50), "core", "the largest shared-memory collective the native core runs "
         "(the default: every size where the channel reads in place, 1 MiB where it stages every byte; larger: the "
         "Python executor); either hands the event loop back every AIOCCL_LOOP_SLICE_US"),
    Knob("AIOCCL_BORROW_BYTES", "65536", "shm", "a collective up to this size, issued from a thread while the "
         "proxy engine idles, runs inside the call (0: always on the engine's thread)"),
    Knob("AIOCCL_SHM_CMA", "1", "shm", "0: never read a same-host peer's large message or collective buffer in place "
         "(process_vm_readv)"),
    Knob("AIOCCL_SHM_CMA_MIN_BYTES", "262144", "shm", "a collective's buffer from this size on is read in place by its "
         "same-host peers, not staged through shared memory"),
    Knob("AIOCCL_NET", "auto", "ib", "auto, socket or ib: which network transport pairs use"),
    Knob("AIOCCL_IB_DISABLE", "0", "ib", "1: never use ib"),
    Knob("AIOCCL_IB_HCA", "all", "ib", "RDMA devices and ports (NCCL syntax)"),
    Knob("AIOCCL_IB_GID_INDEX", "auto", "ib", "GID index"),
    Knob("AIOCCL_IB_BUFFSIZE", "524288", "ib", "bytes per ring slot (one RDMA write)"),
    Knob("AIOCCL_IB_SLOTS", "8", "ib", "ring slots per direction per peer"),
    Knob("AIOCCL_IB_TIMEOUT", "20", "ib", "QP ACK timeout exponent"),
    Knob("AIOCCL_IB_RETRY_CNT", "7", "ib", "QP retries"),
    Knob("AIOCCL_IB_SL", "0", "ib", "service level"),
    Knob("AIOCCL_IB_TC", "0", "ib", "traffic class"),
    Knob("AIOCCL_IB_BACKEND", "pyverbs", "ib", "pyverbs, or loopback (the in-process test backend)"),
    Knob("AIOCCL_GPU_IPC", "1", "gpu", "0: same-host GPU ops stage through host memory"),
    Knob("AIOCCL_GPU_SCRATCH", "67108864", "gpu", "bytes of CUDA-IPC scratch per rank (two halves)"),
    Knob("AIOCCL_GPU_SYNC", "auto", "gpu", "spin or stream: how same-host GPU kernels wait for each other"),
    Knob("AIOCCL_CUDA_DRIVER", "libcuda.so.1", "gpu", "the CUDA driver library the native GPU lane calls"),
    Knob("AIOCCL_GPU_STAGE_PIECE", "4194304", "gpu", "bytes per piece of staged GPU ops"),
    Knob("AIOCCL_GPU_SMALL_BYTES", "0", "gpu", "all_reduces up to this many bytes (<= 4088) run one LL block"),
    Knob("AIOCCL_DEBUG", "unset", "debug", "WARN, INFO or TRACE: log to stderr"),
    Knob("AIOCCL_DEBUG_SUBSYS", "all", "debug", "subsystems to log, or ^NET to exclude"),
    Knob("AIOCCL_JITTER", "unset", "debug", "a seed: the native core's hand-offs yield or sleep at random"),
    Knob("AIOCCL_JITTER_RATE", "10", "debug", "with AIOCCL_JITTER: percent of the hand-offs that yield or sleep"),
    Knob("AIOCCL_HANG_DUMP", "unset", "debug", "a folder: the watchdog writes each rank's pending ops and flight "
         "recorder there when an op waits AIOCCL_WATCHDOG_S"),
    Knob("AIOCCL_JAX_DEBUG", "0", "jax", "1: jax_ext prints a line when each op starts and one when it is done"),
    Knob("AIOCCL_JAX_MESH", "auto", "jax", "who runs a mesh-level op among one process's devices: auto, xla or aioccl"),
    Knob("AIOCCL_JAX_MESH_BYTES", "131072", "jax", "AIOCCL_JAX_MESH=auto: bytes per device from which XLA runs it"),
    Knob("AIOCCL_JAX_GPU_NATIVE", "0", "jax", "1: jax_ext's ops on a GPU lower to aioccl's CUDA custom calls"),
    Knob("AIOCCL_JAX_NO_VERSION_WARNING", "0", "jax", "1: no warning for a jax newer than jax_ext is tested with"),
)

SECRET = {"AIOCCL_COMM_SECRET"}


def effective(env: Mapping[str, str]) -> list[tuple[Knob, str, bool]]:
    """(knob, value in effect, whether the environment set it) for every knob; secrets are masked."""
    out = []
    for k in KNOBS:
        raw = env.get(k.name, "")
        if raw.strip():
            out.append((k, "(set, hidden)" if k.name in SECRET else raw, True))
        else:
            out.append((k, k.default, False))
    return out


def unknown(env: Mapping[str, str]) -> list[str]:
    """``AIOCCL_*`` names in ``env`` that aioccl does not read (typos, most often)."""
    names = {k.name for k in KNOBS}
    return sorted(n for n in env if n.startswith("AIOCCL_") and n not in names)


def check(env: Mapping[str, str]) -> list[str]:
    """The error each knob's own parser raises for the values set now (none when all parse)."""
    from .engine.p2p import rendezvous
    from .engine.shm import setup as shm_setup
    from .envvars import env_timeout
    from .errors import AiocclError
    from .gpu import sizes as gpu_sizes
    from .introspection import recorder_size
    from .native import jitter_settings
    from .transport import tcp
    from .transport.ib import setup as ib_setup
    from .transport.shm import pair_setup as shm_pair_setup
    from .transport.shm import segment as shm
    from .tuning import Tuning
    from .watchdog import watchdog_seconds

    checks: list[Callable[[], object]] = [
        lambda: env_timeout(env), lambda: recorder_size(env), lambda: tcp.peer_timeout(dict(env)),
        lambda: Tuning.from_env(env), lambda: shm_setup.settings(env), lambda: ib_setup.settings(env),
        lambda: gpu_sizes.settings(env), lambda: watchdog_seconds(env), lambda: shm_pair_setup.ring_capacity(env),
        lambda: shm.wait_policy(env, 1),
        lambda: rendezvous.eager_limit(env), lambda: rendezvous.unexpected_budget(env), lambda: jitter_settings(env)]
    problems = []
    for parse in checks:
        try:
            parse()
        except (AiocclError, ValueError) as e:
            problems.append(str(e))
    return problems
