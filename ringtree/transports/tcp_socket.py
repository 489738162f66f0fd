"""TCP socket settings: buffer sizing and how many sockets a peer gets.

Buffers: Linux grows each TCP socket's buffers up to ``tcp_wmem``/``tcp_rmem``'s maximum as
the bandwidth-delay product requires, and setting ``SO_SNDBUF``/``SO_RCVBUF`` switches that
off (tcp(7)). So ringtree sets a size (``RINGTREE_SOCKET_BUFFER``, default 4 MiB) only where
autotuning could not reach it, and otherwise leaves the kernel in charge.

Sockets per peer: ``RINGTREE_NSOCKS_PERTHREAD`` (NCCL's ``NCCL_NSOCKS_PERTHREAD``). NCCL
also has ``NCCL_SOCKET_NTHREADS``, helper threads that each drive that many sockets;
ringtree has no such threads — the rank's one poll loop drives every socket — so it has no
such variable.
"""

from __future__ import annotations

import socket

from ringtree.settings import current

SOCKET_BUFFER = 4 << 20   # RINGTREE_SOCKET_BUFFER: at least this much socket buffer
STRIPE_MIN = 256 << 10    # messages this large are split over a peer's sockets
STRIPE_SHIFT = 24        # stripe j of channel c introduces itself as c | j << 24


def _autotune_max(name: str) -> int:
    """The kernel's ceiling for TCP buffer autotuning (``tcp_wmem``/``tcp_rmem``)."""
    try:
        with open(f"/proc/sys/net/ipv4/{name}") as f:
            return int(f.read().split()[2])
    except (OSError, ValueError, IndexError):
        return 0


def _buffers() -> list[tuple[int, int]]:
    """Socket options to set. Setting SO_SNDBUF/SO_RCVBUF turns the kernel's autotuning
    off, so ask only where autotuning could not reach ``RINGTREE_SOCKET_BUFFER`` anyway
    (it grows each buffer up to ``tcp_wmem``/``tcp_rmem``'s maximum as the bandwidth-delay
    product requires)."""
    want = current().socket_buffer or SOCKET_BUFFER
    return [(opt, want) for opt, name in ((socket.SO_SNDBUF, "tcp_wmem"),
                                           (socket.SO_RCVBUF, "tcp_rmem"))
            if _autotune_max(name) < want]


_BUFFERS: list[tuple[int, int]] | None = None


def tune(sock: socket.socket) -> None:
    global _BUFFERS
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if _BUFFERS is None:
        _BUFFERS = _buffers()
    for opt, size in _BUFFERS:
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, size)
        except OSError:
            pass


def sockets_per_peer() -> int:
    """``RINGTREE_NSOCKS_PERTHREAD`` (default 1): the sockets a (peer, channel) stripes
    large messages over, all driven by the rank's one poll loop."""
    n = current().nsocks_perthread
    if not 1 <= n <= 64:
        raise ValueError(f"RINGTREE_NSOCKS_PERTHREAD={n}: between 1 and 64 sockets per peer")
    return n
