"""Same-host shared memory: one segment per rank and communicator, and a doorbell.

A segment is a ``/dev/shm`` file, mapped by its owner and by every other
rank of the communicator on the host, laid out as::

    [control page: header, step counter, sleeping flag, 2 op descriptors]
    [slot half 0][slot half 1]      staging areas, alternating by step
    [heap]                          registered buffers (comm.alloc)

Lifetime (no leaks, even after ``kill -9``): the owner creates the file, the
peers map it, and once everyone has (a bootstrap agreement) the owner
unlinks it; from then on the memory lives exactly as long as some process
maps it. A crash inside that short window leaves a file whose name carries
the dead owner's pid; the next communicator created on the host removes it
(``sweep_stale()``).

The doorbell is an abstract-namespace Unix datagram socket (it vanishes with
its process, so it cannot leak either). A rank that has spun long enough
waiting for its peers sets its *sleeping* flag and parks on its doorbell; a
rank that publishes a step rings the bell of every peer whose flag is set.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import re
import socket
import time
from collections.abc import Callable, Mapping

import numpy as np

from ... import log
from ...envvars import env_float

_log = log.get("SHM")

SHM_DIR = "/dev/shm"
CONTROL_BYTES = 4096
# int64 slots of the control page
MAGIC, VERSION, HALF, HEAP, PID, HEAP_OFF = 0, 1, 2, 3, 4, 5
# where the owner maps this segment, and a random word: a peer that finds the word there through
# process_vm_readv may read the owner's buffers in place (transport/cma.py, engine/shm/setup.py)
SELF, NONCE = 6, 7
CTR = 8  # the last step this rank published (its own cache line)
SLEEP = 16  # 1 while this rank is parked on its doorbell
GAVE_UP = 24  # the last op (its channel order + 1) this rank gave up at its deadline (engine/shm/channel.py)
# the channel's verdicts on given-up ops, in its rank 0's segment, written under flock (shm_verdict.py):
# VERDICTS entries of VERDICT_LEN words, the op order's entry at (order % VERDICTS)
VERDICT_AT, VERDICTS, VERDICT_LEN = 64, 16, 4
DESC = 32  # two descriptors of DESC_LEN int64, one per step parity
DESC_LEN = 8  # seq, kind, count, root, registered IN and OUT offsets, in-place IN and OUT addresses
MAGIC_VALUE = 0x4C4343_4F494121  # "!AIOCCL"
LAYOUT_VERSION = 2
# the segment's layout as the native core reads it too (channel.h's AC_*): checked against the core's
# exports when a channel is made (``layout_differs``), so the two tables cannot drift apart unseen
LAYOUT = {"CONTROL_BYTES": CONTROL_BYTES, "W_HALF": HALF, "W_CTR": CTR, "W_SLEEP": SLEEP, "W_GAVE_UP": GAVE_UP,
          "W_DESC": DESC, "DESC_LEN": DESC_LEN, "W_PID": PID, "W_SELF": SELF, "W_NONCE": NONCE}


def layout_differs(core: object) -> str:
    """Where the native core's segment layout differs from this module's ('' when it agrees)."""
    return "; ".join(f"{name}: {getattr(core, name, None)} in the core, {value} here"
                     for name, value in LAYOUT.items() if getattr(core, name, None) != value)


STALE_AGE_S = 10.0  # a dead owner's file younger than this may be a rank still bootstrapping elsewhere
_NAME = re.compile(r"^aioccl-[0-9a-f]{16}-(\d+)-(\d+)$")


def segment_name(comm_id: int, rank: int, pid: int) -> str:
    return f"aioccl-{comm_id & (2**64 - 1):016x}-{rank}-{pid}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(directory: str = SHM_DIR, min_age: float = STALE_AGE_S) -> list[str]:
    """Remove segments left by processes that died before unlinking them; returns their names."""
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    now = time.time()
    for name in names:
        m = _NAME.match(name)
        if m is None or _alive(int(m.group(2))):
            continue
        path = os.path.join(directory, name)
        try:
            if now - os.stat(path).st_mtime < min_age:
                continue
            os.unlink(path)
            removed.append(name)
        except OSError:
            continue
    if removed:
        _log.info("removed %d stale segment(s) of dead processes: %s", len(removed), ", ".join(removed))
    return removed


def layout(half: int, heap: int) -> tuple[int, int]:
    """(heap offset, total size) of a segment with slot halves of ``half`` bytes."""
    heap_off = CONTROL_BYTES + 2 * half
    return heap_off, heap_off + heap


class Segment:
    """One mapped segment (mine or a peer's)."""

    def __init__(self, name: str, mm: mmap.mmap, owner: bool, directory: str = SHM_DIR, fd: int = -1) -> None:
        self.name, self.mm, self.owner, self.directory = name, mm, owner, directory
        self.unlinked = not owner
        self.fd = fd  # kept open (keep_fd): a channel's ranks flock its rank 0 segment to decide a give-up

    @classmethod
    def create(cls, name: str, half: int, heap: int, directory: str = SHM_DIR, keep_fd: bool = False) -> Segment:
        heap_off, size = layout(half, heap)
        path = os.path.join(directory, name)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)  # sparse: pages cost memory only once touched
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.unlink(path)
            os.close(fd)
            raise
        if not keep_fd:
            os.close(fd)
            fd = -1
        seg = cls(name, mm, True, directory, fd)
        ctl = memoryview(mm)[:CONTROL_BYTES].cast("q")
        ctl[VERSION], ctl[HALF], ctl[HEAP], ctl[PID], ctl[HEAP_OFF] = LAYOUT_VERSION, half, heap, os.getpid(), heap_off
        ctl[NONCE] = int.from_bytes(os.urandom(8), "little", signed=True)
        ctl[SELF] = int(np.frombuffer(mm, dtype=np.uint8, count=8).ctypes.data)
        ctl[MAGIC] = MAGIC_VALUE  # last: a reader that sees the magic sees the rest
        ctl.release()
        return seg

    @classmethod
    def open(cls, name: str, directory: str = SHM_DIR, keep_fd: bool = False) -> Segment:
        fd = os.open(os.path.join(directory, name), os.O_RDWR)
        try:
            mm = mmap.mmap(fd, os.fstat(fd).st_size)
        except BaseException:
            os.close(fd)
            raise
        if not keep_fd:
            os.close(fd)
            fd = -1
        seg = cls(name, mm, False, directory, fd)
        ctl = memoryview(mm)[:CONTROL_BYTES].cast("q")
        ours = ctl[MAGIC] == MAGIC_VALUE and ctl[VERSION] == LAYOUT_VERSION
        ctl.release()
        if not ours:
            seg.close()
            raise OSError(f"{name}: not an aioccl segment of layout {LAYOUT_VERSION}")
        return seg

    def unlink(self) -> None:
        if not self.unlinked:
            self.unlinked = True
            try:
                os.unlink(os.path.join(self.directory, self.name))
            except FileNotFoundError:
                pass

    def close(self) -> None:
        """Unmap, unless user arrays still point into it (then the unmap happens when they go)."""
        self.unlink()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        try:
            self.mm.close()
        except BufferError:
            pass


DEFAULT_SPIN_US = 100.0


def usable_cpus() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def wait_policy(env: Mapping[str, str], local_ranks: int) -> tuple[float, bool]:
    """How a same-host rank waits for a peer before it parks on its doorbell: (spin seconds, yield between
    looks), from ``AIOCCL_SHM_SPIN_US`` and ``AIOCCL_SHM_YIELD``.

    Yielding (``sched_yield``) is the default because a machine is rarely ours alone. When the peer shares
    this core with us, a spin that does not yield only delays it; a parked rank then waits for the bell and
    the scheduler (on a 2-core machine beside one busy process, 8 B all_reduce took 260 us spinning, 85 us
    yielding; idle it costs nothing measurable: benchmarks/compare.py --loads, docs/benchmarks.md). A rank on
    a core of its own (pinned ranks) can set ``AIOCCL_SHM_YIELD=0``; without yielding, a rank does not spin
    at all when this host's ranks outnumber its cores (it would take the core its peer needs).
    """
    spin = max(0.0, env_float(env, "AIOCCL_SHM_SPIN_US", DEFAULT_SPIN_US)) * 1e-6
    polite = env.get("AIOCCL_SHM_YIELD", "1").strip().lower() not in ("0", "false", "no")
    cpus = usable_cpus()
    return (spin if polite or local_ranks <= cpus else 0.0), polite or local_ranks > cpus


def doorbell_address(comm_id: int, rank: int) -> bytes:
    return f"\0aioccl-bell-{comm_id & (2**64 - 1):016x}-{rank}".encode()


class Doorbell:
    """My bell (a bound datagram socket) and the means to ring peers' bells."""

    def __init__(self, comm_id: int, rank: int,
                 address: Callable[[int, int], bytes] = doorbell_address) -> None:
        self.comm_id = comm_id
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.sock.bind(address(comm_id, rank))
            self.sock.setblocking(False)
            self._out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._out.setblocking(False)
        except BaseException:
            self.sock.close()
            raise
        self._addrs: dict[int, bytes] = {}

    def fileno(self) -> int:
        return self.sock.fileno()

    def ring(self, rank: int) -> None:
        addr = self._addrs.get(rank)
        if addr is None:
            addr = self._addrs[rank] = self.address(self.comm_id, rank)
        try:
            self._out.sendto(b"!", addr)
        except OSError:
            pass  # a full bell has rung already; a vanished peer is detected by its connection

    def sender(self) -> int:
        """The descriptor rings go out from (the native core rings from C with it)."""
        return self._out.fileno()

    def drain(self) -> int:
        n = 0
        while True:
            try:
                self.sock.recv(64)
                n += 1
            except (BlockingIOError, InterruptedError):
                return n
            except OSError:
                return n

    def close(self) -> None:
        self.sock.close()
        self._out.close()


def stop_reader(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    """``loop.remove_reader``, quiet when the fd or the loop is already gone (teardown paths)."""
    try:
        loop.remove_reader(fd)
    except (ValueError, OSError):
        pass


class LoopBell:
    """A doorbell read on an event loop: one ring wakes every listener, and each re-checks its own state
    (the pair hub its FIFOs, each shared-memory channel its counters)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, comm_id: int, rank: int,
                 address: Callable[[int, int], bytes] = doorbell_address) -> None:
        self.loop = loop
        self.bell = Doorbell(comm_id, rank, address)
        self.listeners: list[Callable[[], None]] = []
        self._reading = False

    def start(self) -> None:
        if not self._reading:
            self.loop.add_reader(self.bell.fileno(), self._on_bell)
            self._reading = True

    def ring(self, rank: int) -> None:
        self.bell.ring(rank)

    def _on_bell(self) -> None:
        self.bell.drain()
        for listener in list(self.listeners):
            listener()

    def close(self) -> None:
        if self._reading:
            self._reading = False
            stop_reader(self.loop, self.bell.fileno())
        self.bell.close()
