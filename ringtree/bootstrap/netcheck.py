"""Can every host reach the addresses the others advertise? Answer in seconds, not at the
collective timeout.

The classic multi-node hang: one host picks an interface the others cannot route to (a
docker bridge, an InfiniBand port on another fabric, a management network) and publishes
its address; peers' connects then vanish into silence until some timeout minutes later.
NCCL's answer is ``NCCL_SOCKET_IFNAME``; ours is to *test* the advertised addresses:

- :func:`probe` opens nonblocking TCP connections to many ``(address, port)`` at once and
  reports, within ``timeout`` seconds, which answered (a completed handshake is the
  proof; nothing is sent, and listeners drop connections that close without a hello).
- :func:`check_peers` runs when a communicator spans hosts: every rank publishes what it
  advertises (host, address, port, interface, its other interfaces), probes the ranks on
  other hosts, publishes what failed, and if anything did every rank raises
  :class:`NetworkUnreachable` naming the host, the address, the interface and
  ``RINGTREE_SOCKET_IFNAME``. ``RINGTREE_CHECK_NET=0`` turns it off.
- :func:`unreachable_note` is the same probe after a collective timed out: it names the
  peers this rank can no longer reach (a partition), which the timeout alone cannot.
- :func:`matrix` formats a host × address table (``ringtree doctor --net``,
  ``ringtree run --check-net``; see :mod:`ringtree.bootstrap.netmatrix`).
"""

from __future__ import annotations

import errno
import json
import os
import select
import socket
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from ringtree.bootstrap.rendezvous import wait_count
from ringtree.errors import PeerError
from ringtree.settings import current

PROBE_TIMEOUT = 3.0  # RINGTREE_CHECK_NET_TIMEOUT


class NetworkUnreachable(PeerError):
    """A rank advertised an address that another rank cannot connect to."""


@dataclass
class Advert:
    """What one process advertises: where it listens and what else it has."""

    rank: int
    hostname: str
    addr: str
    port: int
    ifname: str
    ifaces: list[tuple[str, str]] = field(default_factory=list)
    host_id: str = ""
    spec: str = ""  # its RINGTREE_SOCKET_IFNAME

    @classmethod
    def local(cls, rank: int, addr: str, port: int, host_id: str = "") -> Advert:
        from ringtree.bootstrap.netif import list_interfaces

        ifaces = list_interfaces()
        ifname = next((n for n, a in ifaces if a == addr), "?")
        return cls(rank, socket.gethostname(), addr, port, ifname, ifaces, host_id,
                   (current().socket_ifname or ""))

    def where(self) -> str:
        return f"{self.addr}:{self.port} (interface {self.ifname} on host {self.hostname})"


def probe(targets: Sequence[tuple[str, int]], timeout: float) -> list[str | None]:
    """Connect to every target at once; per target None (answered) or why not."""
    out: list[str | None] = ["no answer"] * len(targets)
    socks: dict[int, tuple[int, socket.socket]] = {}
    for i, (host, port) in enumerate(targets):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        err = s.connect_ex((host, port))
        if err in (0, errno.EINPROGRESS):
            socks[s.fileno()] = (i, s)
            if err == 0:
                out[i] = None
        else:
            out[i] = os.strerror(err)
            s.close()
    deadline = time.monotonic() + timeout
    p = select.poll()
    for fd in socks:
        p.register(fd, select.POLLOUT)
    waiting = {fd for fd, (i, _) in socks.items() if out[i] is not None}
    try:
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for fd, _ in p.poll(max(1, int(left * 1000))):
                if fd not in waiting:
                    continue
                i, s = socks[fd]
                err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                out[i] = None if err == 0 else os.strerror(err)
                waiting.discard(fd)
                p.unregister(fd)
        for fd in waiting:
            out[socks[fd][0]] = f"no answer within {timeout:g} s"
    finally:
        for _, s in socks.values():
            s.close()
    return out


def enabled() -> bool:
    return bool(current().check_net)


def describe_failures(adverts: Sequence[Advert], failures: dict[int, dict[int, str]],
                      noun: str = "rank") -> str:
    """One message for ``failures[src][dst] = why``: per unreachable advertised address,
    who could not reach it, how that host chose it, and what to set."""
    by_addr: dict[tuple[str, str, str], list[tuple[int, int, str]]] = {}
    for src, row in failures.items():
        for dst, why in row.items():
            a = adverts[dst]
            by_addr.setdefault((a.hostname, a.addr, a.ifname), []).append((dst, src, why))
    lines = []
    for (hostname, addr, ifname), hits in sorted(by_addr.items()):
        a = adverts[hits[0][0]]
        dsts = sorted({d for d, _, _ in hits})
        srcs = sorted({s for _, s, _ in hits})
        src_hosts = sorted({adverts[s].hostname for s in srcs})
        others = ", ".join(f"{n} {ip}" for n, ip in a.ifaces if ip != addr) or "none"
        how = f"RINGTREE_SOCKET_IFNAME={a.spec!r} there" if a.spec else \
            "RINGTREE_SOCKET_IFNAME is unset there: the route to the master chose it"
        lines.append(
            f"host {hostname} advertises {addr} (interface {ifname}; {how}) for {noun}(s) "
            f"{', '.join(map(str, dsts))}, and {noun}(s) {', '.join(map(str, srcs))} on "
            f"{', '.join(src_hosts)} cannot reach it ({hits[0][2]}); {hostname} also has "
            f"{others}")
    return ("network check failed: " + "; ".join(lines) + ". Set RINGTREE_SOCKET_IFNAME "
            "to an interface the other hosts can reach (NCCL_SOCKET_IFNAME syntax: eth0, "
            "^docker,lo, =ib0); RINGTREE_CHECK_NET=0 skips this check")


def check_listener(store, prefix: str, rank: int, size: int, host: str, listener,
                   host_id: str, timeout: float) -> None:
    """A new communicator across hosts: check (when enabled) that every rank reaches
    ``host`` and the port of this rank's ``listener``; the listener is closed on failure."""
    if not enabled():
        return
    try:
        check_peers(store, prefix, Advert.local(rank, host, listener.getsockname()[1],
                                                host_id), size, timeout)
    except BaseException:
        listener.close()
        raise


def check_peers(store, prefix: str, me: Advert, size: int, timeout: float) -> list[Advert]:
    """Exchange adverts through the store, probe the ranks on other hosts, and raise
    :class:`NetworkUnreachable` on every rank if any rank could not reach any other."""
    store.set(f"{prefix}/net/advert/{me.rank}", json.dumps(asdict(me)))
    adverts = []
    for r in range(size):
        raw = store.get(f"{prefix}/net/advert/{r}", timeout=timeout)
        d = json.loads(raw)
        d["ifaces"] = [tuple(x) for x in d["ifaces"]]
        adverts.append(Advert(**d))
    remote = [a for a in adverts if a.host_id != me.host_id and a.rank != me.rank]
    wait = current().check_net_timeout or PROBE_TIMEOUT
    why = probe([(a.addr, a.port) for a in remote], wait)
    mine = {a.rank: w for a, w in zip(remote, why) if w is not None}
    store.set(f"{prefix}/net/result/{me.rank}", json.dumps(mine))
    failures = {}
    for r in range(size):
        raw = store.get(f"{prefix}/net/result/{r}", timeout=timeout + wait)
        row = {int(k): v for k, v in json.loads(raw).items()}
        if row:
            failures[r] = row
    store.add(f"{prefix}/net/read", 1)
    if failures:
        # every rank raises: leave together, so the rank serving the store does not exit
        # (closing it) before the others have read the results they need to say why
        try:
            wait_count(store, f"{prefix}/net/read", size, min(timeout, 5.0))
        except Exception:  # noqa: BLE001 - the store is gone: everyone has read and left
            pass
        dst = min(d for row in failures.values() for d in row)
        raise NetworkUnreachable(dst, f"rank {me.rank}: " + describe_failures(adverts,
                                                                               failures))
    return adverts


def unreachable_note(peers: Sequence[tuple[int, str, int]], timeout: float = 1.5) -> str:
    """After a timeout: which of ``peers`` (rank, address, port) no longer answer."""
    if not peers:
        return ""
    why = probe([(h, p) for _, h, p in peers], timeout)
    lost = [f"rank {r} at {h}:{p} ({w})" for (r, h, p), w in zip(peers, why) if w]
    if not lost:
        return ""
    return ("\nthis rank cannot reach " + ", ".join(lost) + ": a network partition or a "
            "dead host?")
