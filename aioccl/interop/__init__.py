"""Adapters for array libraries that have no place in ``aioccl.buffers``' generic paths."""
