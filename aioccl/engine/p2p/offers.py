"""Offers of a large message for the receiver to read in place, and the handshake that keeps it safe.

Between two ranks on one host that may read each other's memory
(``transport/cma.py``), a rendezvous RTS carries an *offer*: where the data
lies in the sender, and a slot of this process's offer table. The receiver
copies the data straight into its posted receive (one copy, none through
the FIFO) and answers RDONE instead of CTS.

The danger is a sender that gives up at its deadline and hands its buffer
back to the user while a receiver reads it. So both sides mark the slot
before they act (Dekker's handshake; a fence on each side): the receiver
writes TAKEN, then checks WITHDRAWN; the sender at its deadline writes
WITHDRAWN, then checks TAKEN. At least one sees the other: either the read
happens and the sender waits for it to end (its send then succeeds), or the
receiver declines and its receive fails, naming the sender.

The table is allocated once per process and never freed, because a peer may
look at a slot long after its send ended (an RTS waits for its receive); a
slot records its offer's serial number (``OWNER``), so a stale look at a
reused slot reads as withdrawn. With every slot in use, a send goes without
an offer (CTS and data, as over other transports).
"""

from __future__ import annotations

import itertools
import struct
import threading

import numpy as np

from ...transport.cma import PeerMemory, address
from ...transport.shm.fifo import fence

OFFER = struct.Struct("<QQq")  # an RTS's payload: data address, slot address, the offer's serial number
SLOTS = 1024
OWNER, TAKEN, WITHDRAWN = 0, 1, 2  # a slot's words
READ, DECLINED, REFUSED = "read", "declined", "refused"  # what a receiver made of an offer

_table = np.zeros((SLOTS, 3), np.int64)
_free = list(range(SLOTS))
_lock = threading.Lock()
_serial = itertools.count(1)


class Offer:
    """The sender's side: holds the payload until the read is over or the offer withdrawn."""

    __slots__ = ("payload", "slot", "serial", "packed")

    def __init__(self, payload: memoryview, slot: int, serial: int) -> None:
        self.payload, self.slot, self.serial = payload, slot, serial
        row = _table[slot]
        row[TAKEN] = row[WITHDRAWN] = 0
        row[OWNER] = serial  # last: a reader that sees the owner sees the cleared marks too (x86 store order)
        self.packed = OFFER.pack(address(payload), int(_table.ctypes.data) + slot * 24, serial)

    @classmethod
    def make(cls, payload: memoryview) -> Offer | None:
        with _lock:
            if not _free:
                return None
            slot = _free.pop()
            serial = next(_serial)
        return cls(payload, slot, serial)

    def taken(self) -> bool:
        """Is a receiver reading it now (or done reading)?"""
        return int(_table[self.slot][TAKEN]) == self.serial

    def withdraw(self) -> bool:
        """At the sender's deadline: True if no receiver had taken it (and now none will)."""
        row = _table[self.slot]
        row[WITHDRAWN] = 1
        fence()
        return int(row[TAKEN]) != self.serial

    def release(self) -> None:
        """The offer is over (read, declined, answered by CTS, or withdrawn): its slot may serve another."""
        _table[self.slot][OWNER] = 0
        with _lock:
            _free.append(self.slot)


class Taker:
    """The receiver's side, one per rank (its scratch words are reused)."""

    def __init__(self) -> None:
        self._row = np.zeros(3, np.int64)
        self._mark = np.zeros(1, np.int64)

    def take(self, mem: PeerMemory, offer: bytes, target: memoryview) -> str:
        """Read the offered data into ``target``: READ; DECLINED when the sender withdrew it; REFUSED when
        the kernel would not (the data then comes by CTS)."""
        data, slot, serial = OFFER.unpack(offer)
        row, row_at = self._row, int(self._row.ctypes.data)
        if not mem.read(row_at, slot, 24):
            return REFUSED
        if row[OWNER] != serial or row[WITHDRAWN]:
            return DECLINED
        self._mark[0] = serial
        if not mem.write(slot + 8 * TAKEN, int(self._mark.ctypes.data), 8):
            return REFUSED
        fence()
        if not mem.read(row_at, slot, 24):
            return REFUSED
        if row[OWNER] != serial or row[WITHDRAWN]:
            return DECLINED
        return READ if mem.read(address(target), data, len(target)) else REFUSED
