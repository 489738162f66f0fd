"""TCP socket settings: buffer sizing and how many sockets a peer gets.

Buffers: Linux grows each TCP socket's buffers up to ``tcp_wmem``/``tcp_rmem``'s maximum as
the bandwidth-delay product requires, and setting ``SO_SNDBUF``/``SO_RCVBUF`` switches that
off (tcp(7)). Autotuning sizes for a reader and writer that keep up: about twice the
congestion window, a few milliseconds of the link. A rank is one Python thread that also
reduces, and on a busy machine it waits for a core; while it does, its link carries only
what the kernel holds. So where the kernel allows it (``net.core.wmem_max``/``rmem_max``
at least ``RINGTREE_SOCKET_BUFFER``, default 4 MiB) ringtree asks for that size, which the
kernel doubles: 8 MiB, 335 ms of a 200 Mbit/s link, 67 ms at 1 Gbit/s. On the testbed's
4×1 ring at 200 Mbit/s this took a 64 MiB all-reduce from 4,441 to 4,350 ms (median of 6,
quiet machine; gloo 4,340) and a 16 MiB one from 1,155 to 1,126 ms with other work on the
machine (median of 9); at 1 Gbit/s the two were equal (215 ms).
``benchmarks/multihost_link.py`` reruns the comparison. Where the cap is lower, the size
is asked for only if the doubled cap still beats autotuning's ceiling
(``tcp_wmem``/``tcp_rmem``); else the kernel stays in charge. ``RINGTREE_SOCKET_BUFFER=0`` leaves autotuning in charge everywhere; links whose
bandwidth-delay product exceeds 8 MiB want a larger size.

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


def _sysctl(path: str, field: int = 0) -> int:
    """A number from ``/proc/sys/net/...`` (0 if unreadable)."""
    try:
        with open(f"/proc/sys/net/{path}") as f:
            return int(f.read().split()[field])
    except (OSError, ValueError, IndexError):
        return 0


def buffer_size(want: int, cap: int, autotune_max: int) -> int | None:
    """The ``SO_SNDBUF``/``SO_RCVBUF`` to ask for, or None to leave the kernel's
    autotuning in charge. ``want``: the size wanted (``RINGTREE_SOCKET_BUFFER``);
    ``cap``: the most an unprivileged socket may ask for (``net.core.wmem_max`` or
    ``rmem_max``); ``autotune_max``: what autotuning may grow to (``tcp_wmem``'s or
    ``tcp_rmem``'s maximum). The kernel doubles what it grants, for its bookkeeping."""
    if cap >= want:
        return want          # the full size: the kernel holds it whatever autotuning thinks
    if 2 * cap > autotune_max:
        return cap           # less than wanted, but more than autotuning could reach
    return None


def _buffers() -> list[tuple[int, int]]:
    """Socket options to set (:func:`buffer_size` for each direction)."""
    want = current().socket_buffer
    if want == 0:
        return []            # RINGTREE_SOCKET_BUFFER=0: autotuning only
    want = want or SOCKET_BUFFER
    out = []
    for opt, core, tcp in ((socket.SO_SNDBUF, "core/wmem_max", "ipv4/tcp_wmem"),
                           (socket.SO_RCVBUF, "core/rmem_max", "ipv4/tcp_rmem")):
        size = buffer_size(want, _sysctl(core), _sysctl(tcp, 2))
        if size is not None:
            out.append((opt, size))
    return out


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
