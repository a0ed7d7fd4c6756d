"""Reading a same-host peer's memory in place: Linux cross-memory attach (``process_vm_readv``).

A large point-to-point message between two ranks on one host would
otherwise cross the pair's byte FIFO: two copies (into the FIFO, out of it)
and half the memory bandwidth. With cross-memory attach the receiver copies
straight from the sender's buffer into its posted receive, one copy, as
Open MPI's shared-memory transport does.

The kernel allows it between processes of one user unless Yama's
``ptrace_scope`` (or a container's seccomp policy) forbids it, and a pid
means the peer only if both share a pid namespace. So each side proves it
at pair set-up: it reads a random *cookie* at an address the peer announced
and uses the pair only if the value is the one announced (``PeerMemory.open``).
Where that fails, messages take the FIFO as before.

A few words of the peer's memory can also be written (``write``): the
rendezvous uses that to mark an offer taken before reading it, so a sender
that gives up at its deadline knows whether its buffer is being read.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import sys

import numpy as np

from .. import log

_log = log.get("SHM")
PR_SET_PTRACER, PR_SET_PTRACER_ANY = 0x59616D61, ctypes.c_ulong(-1).value
CHUNK = 64 << 20  # one call reads at most this much (the kernel may also return less: the rest is read again)


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        for name in ("process_vm_readv", "process_vm_writev"):
            fn = getattr(libc, name)
            fn.restype = ctypes.c_ssize_t
            fn.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.POINTER(_IoVec),
                           ctypes.c_ulong, ctypes.c_ulong]
        # Yama (ptrace_scope 1) lets only ancestors read a process: allow our peers, which are not
        libc.prctl(PR_SET_PTRACER, ctypes.c_ulong(PR_SET_PTRACER_ANY), 0, 0, 0)
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()
_COOKIE = np.frombuffer(secrets.token_bytes(8), dtype=np.int64).copy()  # this process's proof of identity


def cookie() -> dict[str, int]:
    """What a rank announces to a same-host peer so the peer can prove it may read this rank's memory."""
    return {"pid": os.getpid(), "addr": int(_COOKIE.ctypes.data), "value": int(_COOKIE[0])}


def enabled() -> bool:
    """Whether this process reads peers in place at all (``AIOCCL_SHM_CMA``, and a kernel that has it)."""
    return _LIBC is not None and os.environ.get("AIOCCL_SHM_CMA", "1").strip().lower() not in ("0", "false", "no")


def address(buf: memoryview) -> int:
    """Where a contiguous buffer's first byte lies in this process."""
    return int(np.frombuffer(buf, dtype=np.uint8).ctypes.data) if len(buf) else 0


class PeerMemory:
    """Copies out of (and, a word at a time, into) one peer process's memory."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    @classmethod
    def open(cls, announced: dict[str, int] | None) -> PeerMemory | None:
        """A reader of the peer that announced ``announced`` (``cookie()``), or None where the kernel
        refuses, the pid is another process (another pid namespace), or the peer announced nothing."""
        try:
            pid, addr, value = int(announced["pid"]), int(announced["addr"]), int(announced["value"])  # type: ignore[index]
        except (TypeError, KeyError, ValueError):
            return None
        return cls.proven(pid, addr, value)

    @classmethod
    def proven(cls, pid: int, addr: int, value: int) -> PeerMemory | None:
        """A reader of process ``pid``, if the int64 at its ``addr`` reads as ``value`` (else None: the
        kernel refuses, ``AIOCCL_SHM_CMA=0``, or that pid is another process, in another pid namespace).
        A shared-memory segment names its owner's pid, where the owner maps it and a random word in it
        (``segment.py``'s ``PID``, ``SELF``, ``NONCE``): a channel's ranks prove it with those."""
        if not enabled() or pid <= 0:
            return None
        mem = cls(pid)
        got = np.zeros(1, np.int64)
        if not mem.read(int(got.ctypes.data), addr, 8):
            _log.debug("cross-memory attach to pid %d refused: %s", pid, os.strerror(ctypes.get_errno()))
            return None
        if int(got[0]) != value:
            _log.debug("pid %d is not the peer here (another pid namespace): no cross-memory attach", pid)
            return None
        return mem

    def read(self, dst: int, src: int, nbytes: int) -> bool:
        """Copy ``nbytes`` from the peer's ``src`` to my ``dst``; False if the kernel refused."""
        return self._move(_LIBC.process_vm_readv if _LIBC is not None else None, dst, src, nbytes)

    def write(self, dst: int, src: int, nbytes: int) -> bool:
        """Copy ``nbytes`` from my ``src`` to the peer's ``dst``; False if the kernel refused."""
        return self._move(_LIBC.process_vm_writev if _LIBC is not None else None, src, dst, nbytes)

    def _move(self, fn: object, local: int, remote: int, nbytes: int) -> bool:
        if fn is None:
            return False
        done = 0
        while done < nbytes:
            n = min(nbytes - done, CHUNK)
            lv, rv = _IoVec(local + done, n), _IoVec(remote + done, n)
            got = fn(self.pid, ctypes.byref(lv), 1, ctypes.byref(rv), 1, 0)  # type: ignore[operator]
            if got <= 0:
                return False
            done += got
        return True
