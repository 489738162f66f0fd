"""TCP socket settings: buffer sizing and how many sockets a peer gets; and the TCP
transport's record (:data:`TCP`, listed in :mod:`ringtree.transports.registry`).

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

Congestion control: ``RINGTREE_SOCKET_CC`` (default ``cubic``) per socket
(``TCP_CONGESTION``, tcp(7)) where the kernel offers it; ``kernel`` keeps the kernel's default.
BBR (Cardwell et al., 2016), the default of many kernels and of this project's test
machines, estimates the bottleneck from delivery-rate samples and paces at that estimate;
a collective's connections carry bursts with idle gaps between them (an exchange step uses
a connection, the next step another), and BBR's pacing then stalls some of them. On the
testbed's 4×1 hosts at 1 Gbit/s a 256 KiB halving-doubling all-reduce took 3.3–29 ms
under BBR (medians 4.1 and 5.4 ms over two runs of 15 calls; the ring 3.6 ms) and
3.3–3.5 ms under CUBIC (median 3.3, the ring's too); a recursive-doubling all-gather of
256 KiB 4.9 / 2.8 ms against 1.7 / 1.6. Bulk calls did not move: 16 MiB ring all-reduce at
200 Mbit/s 1,121 / 1,131 ms under BBR, 1,115 / 1,125 under CUBIC; 2×4 hierarchical
reduce-scatter at 1 Gbit/s 89 / 93 against 91 / 89 ms (``benchmarks/multihost.py``,
alternating the two).

Sockets per peer: NCCL's socket transport opens ``NCCL_SOCKET_NTHREADS`` ×
``NCCL_NSOCKS_PERTHREAD`` sockets per connection (at most 16 threads and 64 sockets;
``net_socket.cc``, ``ncclSocketGetNsockNthread``) and splits a message over them, each
helper thread driving its share. ringtree reads the same two numbers
(``RINGTREE_SOCKET_NTHREADS``, ``RINGTREE_NSOCKS_PERTHREAD``) and opens as many sockets
per (peer, channel), so settings carried over from an NCCL job open the same streams. It
has no helper threads: the rank's one poll loop drives every socket, and a product past
the limits is an error rather than NCCL's silent clamp.
"""

from __future__ import annotations

import socket

from ringtree.settings import current
from ringtree.transports.base import LinkModel, Setup, Transport, TransportKind

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


def congestion_control() -> bytes | None:
    """The ``TCP_CONGESTION`` to set (``RINGTREE_SOCKET_CC``), or None to keep the
    kernel's: also None where it is not offered (``tcp_available_congestion_control``)."""
    name = (current().socket_cc or "").strip()
    if name in ("", "kernel") or not hasattr(socket, "TCP_CONGESTION"):
        return None
    try:
        with open("/proc/sys/net/ipv4/tcp_available_congestion_control") as f:
            offered = f.read().split()
    except OSError:
        return None
    return name.encode() if name in offered else None


_BUFFERS: list[tuple[int, int]] | None = None
_CC: list[bytes | None] = []


def tune(sock: socket.socket) -> None:
    """TCP_NODELAY, the socket buffers (:func:`buffer_size`) and the congestion control
    (:func:`congestion_control`) of a ringtree socket; set on a listener, they hold for
    the sockets it accepts."""
    global _BUFFERS
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if _BUFFERS is None:
        _BUFFERS = _buffers()
    if not _CC:
        _CC.append(congestion_control())
    for opt, size in _BUFFERS:
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, size)
        except OSError:
            pass
    if _CC[0] is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, _CC[0])
        except OSError:      # offered but not allowed to this user: the kernel's default
            pass


MAX_THREADS, MAX_SOCKETS = 16, 64  # NCCL's limits (net_socket.cc)


def sockets_per_peer() -> int:
    """The sockets a (peer, channel) stripes large messages over:
    ``RINGTREE_SOCKET_NTHREADS`` × ``RINGTREE_NSOCKS_PERTHREAD`` (both default 1), all
    driven by the rank's one poll loop."""
    s = current()
    per, threads = s.nsocks_perthread, s.socket_nthreads
    if not 1 <= threads <= MAX_THREADS:
        raise ValueError(f"RINGTREE_SOCKET_NTHREADS={threads}: between 1 and {MAX_THREADS}")
    if per < 1 or per * threads > MAX_SOCKETS:
        raise ValueError(f"RINGTREE_NSOCKS_PERTHREAD={per} x RINGTREE_SOCKET_NTHREADS="
                         f"{threads}: between 1 and {MAX_SOCKETS} sockets per peer")
    return per * threads


def open_tcp(setup: Setup, peers: list[int], listener: socket.socket) -> Transport:
    """The TCP transport of this rank: it connects to ``peers`` on their first message
    (the listener is the socket this rank published at rendezvous)."""
    from ringtree.transports.tcp import TcpTransport

    addresses = [(p.host, p.port) for p in setup.peers]
    return TcpTransport(setup.rank, addresses, listener, setup.comm_id, setup.secret,
                        connect_timeout=min(setup.timeout, 60.0))


# any two ranks, after shared memory where both apply
TCP = TransportKind("tcp", priority=1, open=open_tcp, listens=True,
                    model=LinkModel(alpha=40e-6, overhead=25e-6, beta=1 / 1.5e9,
                                    gamma=1 / 3e9))


def hang_up(transport) -> None:
    """:meth:`Transport.hang_up` of TCP: shut every connection down (each peer reads EOF
    at once); the sockets stay open, so a thread polling them is not disturbed (any
    thread may call it)."""
    for conn in list(transport.conns.values()):
        if conn.sock is not None:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
