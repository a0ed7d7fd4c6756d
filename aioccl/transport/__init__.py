"""Byte movers between two ranks: frames over TCP, and a loopback for self-sends."""
