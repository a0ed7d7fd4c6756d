"""Forming a communicator: unique id, authenticated handshake, rendezvous, interfaces."""

from .unique_id import UniqueId

__all__ = ["UniqueId"]
