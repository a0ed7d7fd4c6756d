"""Adapters for array libraries that have no place in :mod:`aioccl.buffers`' generic paths."""
