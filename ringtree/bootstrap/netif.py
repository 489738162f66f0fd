"""Pick the IPv4 address a rank listens on and publishes to its peers.

``RINGTREE_SOCKET_IFNAME`` takes ``NCCL_SOCKET_IFNAME``'s syntax (NCCL env docs):

- ``eth,ib``     interfaces whose name starts with ``eth`` or ``ib`` (earlier entries preferred);
- ``^docker,lo`` every interface except those starting with ``docker`` or ``lo``;
- ``=eth0``      exactly ``eth0`` (``=`` makes every entry an exact name);
- ``^=docker0``  every interface except exactly ``docker0``.

Without it: a loopback master means a single-host job, so ``127.0.0.1``; otherwise the address
of the interface the kernel routes to the master through (a UDP ``connect`` sends no packet),
falling back to the first interface that is neither loopback nor a container bridge (NCCL's
default excludes ``docker`` and ``lo``), then to loopback.

Interfaces are listed with the standard library only (``socket.if_nameindex`` and the Linux
``SIOCGIFADDR`` ioctl), one primary IPv4 address per interface.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections.abc import Sequence

__all__ = ["list_interfaces", "match_interfaces", "parse_ifname_spec", "select_address"]

SIOCGIFADDR = 0x8915  # linux/sockios.h
_VIRTUAL_PREFIXES = ("lo", "docker", "veth", "virbr", "br-")


def list_interfaces() -> list[tuple[str, str]]:
    """``[(name, ipv4_address), ...]`` for every interface that has an IPv4 address."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system
        return []
    out: list[tuple[str, str]] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(s.fileno(), SIOCGIFADDR, request)
            except OSError:  # no IPv4 address (or not Linux)
                continue
            out.append((name, socket.inet_ntoa(reply[20:24])))
    return out


def parse_ifname_spec(spec: str) -> tuple[bool, bool, list[str]]:
    """Split an ``NCCL_SOCKET_IFNAME``-style spec into ``(exclude, exact, names)``."""
    s = spec.strip()
    exclude = s.startswith("^")
    if exclude:
        s = s[1:]
    exact = s.startswith("=")
    if exact:
        s = s[1:]
    names = [n.strip() for n in s.split(",") if n.strip()]
    return exclude, exact, names


def match_interfaces(
    spec: str, interfaces: Sequence[tuple[str, str]]
) -> list[tuple[str, str]]:
    """The entries of ``interfaces`` that ``spec`` selects, best first (pure function).

    Include lists are ordered by the first spec entry each interface matches, then by
    interface order; exclude lists keep interface order but put loopback last.
    """
    exclude, exact, names = parse_ifname_spec(spec)

    def hit(ifname: str, name: str) -> bool:
        return ifname == name if exact else ifname.startswith(name)

    if exclude:
        kept = [i for i in interfaces if not any(hit(i[0], n) for n in names)]
        return sorted(kept, key=lambda i: _is_loopback_ip(i[1]))
    ranked = []
    for pos, iface in enumerate(interfaces):
        first = next((k for k, n in enumerate(names) if hit(iface[0], n)), None)
        if first is not None:
            ranked.append((first, pos, iface))
    return [iface for _, _, iface in sorted(ranked)]


def select_address(spec: str | None = None, master_addr: str | None = None) -> str:
    """The IPv4 address this rank should listen on and publish (see the module docstring).

    ``spec`` defaults to ``$RINGTREE_SOCKET_IFNAME``. Raises ValueError, listing the
    interfaces that exist, when the spec selects none.
    """
    if spec is None:
        from ringtree.settings import current

        spec = current().socket_ifname
    if spec is not None and spec.strip():
        interfaces = list_interfaces()
        matched = match_interfaces(spec, interfaces)
        if not matched:
            have = ", ".join(f"{n} ({a})" for n, a in interfaces) or "none"
            raise ValueError(
                f"RINGTREE_SOCKET_IFNAME={spec!r} matches no interface with an IPv4 address; "
                f"this host has: {have}"
            )
        return matched[0][1]

    if master_addr:
        master_ip = _resolve(master_addr)
        if master_ip is not None:
            if _is_loopback_ip(master_ip):
                return "127.0.0.1"
            routed = _route_source(master_ip)
            if routed is not None:
                return routed
    for name, addr in list_interfaces():
        if not name.startswith(_VIRTUAL_PREFIXES) and not _is_loopback_ip(addr):
            return addr
    return "127.0.0.1"


def _resolve(host: str) -> str | None:
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None
    return str(infos[0][4][0]) if infos else None


def _route_source(ip: str) -> str | None:
    """The local address the kernel would use to reach ``ip`` (UDP connect: no packet)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((ip, 9))
            addr = s.getsockname()[0]
    except OSError:
        return None
    return None if addr == "0.0.0.0" else addr


def _is_loopback_ip(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False
