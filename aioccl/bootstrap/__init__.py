"""Forming a communicator: unique id, authenticated handshake, meeting at the root and the mesh, interfaces."""

from .unique_id import UniqueId

__all__ = ["UniqueId"]
