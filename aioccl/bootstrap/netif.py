"""Which local address a rank listens on and advertises.

``AIOCCL_SOCKET_IFNAME`` follows ``NCCL_SOCKET_IFNAME``: a comma list of
prefixes (``eth,ib``), ``^`` to exclude (``^docker,lo``), ``=`` for exact names
(``=eth0``). Without it, a rank uses the source address the kernel would use
to reach the root: the interface that demonstrably reaches the other ranks,
which is loopback exactly when the job is local.
"""

from __future__ import annotations

import fcntl
import socket
import struct

from ..errors import BootstrapError

SIOCGIFADDR = 0x8915
DEFAULT_SKIP = ("lo", "docker", "veth", "virbr")


def parse_spec(spec: str) -> tuple[bool, bool, list[str]]:
    """(exclude, exact, names) from an ``AIOCCL_SOCKET_IFNAME`` value."""
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    return exclude, exact, [s.strip() for s in spec.split(",") if s.strip()]


def matches(name: str, spec: str) -> bool:
    exclude, exact, names = parse_spec(spec)
    hit = any(name == n if exact else name.startswith(n) for n in names)
    return hit != exclude


def ipv4_interfaces() -> list[tuple[str, str]]:
    """(name, IPv4 address) of every interface that has one, in index order."""
    out = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _idx, name in socket.if_nameindex():
            try:
                res = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            out.append((name, socket.inet_ntoa(res[20:24])))
    return out


def pick_by_name(spec: str) -> str:
    for name, addr in ipv4_interfaces():
        if matches(name, spec):
            return addr
    have = ", ".join(f"{n}={a}" for n, a in ipv4_interfaces())
    raise BootstrapError(f"AIOCCL_SOCKET_IFNAME={spec!r} matches no interface with an IPv4 address (have: {have})")


def route_to(host: str, port: int) -> str:
    """The local address the kernel picks to reach (host, port); nothing is sent."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, port or 9))
        except OSError as e:
            raise BootstrapError(f"no route to the root at {host}:{port}: {e}") from None
        return str(s.getsockname()[0])


def local_address(root_host: str, root_port: int, ifname: str | None) -> str:
    return pick_by_name(ifname) if ifname else route_to(root_host, root_port)


def default_advertised(ifname: str | None) -> str:
    """Address to advertise for a root created with no host given: NCCL's default order, the first interface
    that is not lo/docker/veth/virbr; where a host has only such ones (a container or a network namespace whose
    one NIC is a veth), the first that is not loopback, since other hosts can reach that one and not 127.0.0.1."""
    if ifname:
        return pick_by_name(ifname)
    found = ipv4_interfaces()
    for name, addr in found:
        if not name.startswith(DEFAULT_SKIP):
            return addr
    for name, addr in found:
        if not name.startswith("lo") and not addr.startswith("127."):
            return addr
    return "127.0.0.1"
