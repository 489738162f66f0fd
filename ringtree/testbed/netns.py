"""Hosts made of Linux namespaces, joined by shaped veth links to one bridge.

Each :class:`Host` is a network + UTS + mount namespace held open by a small keeper process
(``_keeper.py``): its own host name, its own interfaces (``lo`` and ``eth0``), its own tmpfs
``/dev/shm``. The bridge lives in a namespace of its own too, so the machine's own network
namespace is never touched::

        host 0 ns            bridge ns             host 1 ns
    eth0 10.77.0.1 ── veth ── p0 ┐           ┌ p1 ── veth ── eth0 10.77.0.2
                                 └── br0 ────┘

Each direction of a link is shaped with a token bucket (``tc tbf``: Linux's
``sch_tbf``; rate, burst, and a queue bound given as latency): host→bridge on ``eth0``,
bridge→host on the bridge port. ``rate=None`` leaves a link unshaped (e.g. a switch
host's).

Each host also owns a share of the machine's CPUs (``cpus="own"``, the default): every
process run in it is bound to them (``sched_setaffinity``, inherited by its children), as
a container's cpuset would. With at least as many CPUs as hosts the shares are disjoint
(:func:`cpu_shares`); with fewer, hosts take one CPU each in turn, so two hosts share a
CPU but a host's ranks stay together, as on a real host. Without it the scheduler moves
every host's ranks over every CPU, and a host's timing then depends on whose ranks it
happened to place together: on 2×2 at 1 Gbit/s with 2 CPUs a 256 B hierarchical
all-reduce took 0.30 ms with each host's ranks on one CPU and 0.52 ms with the two
leaders on one CPU (recursive doubling 0.33–0.35 ms either way), and unbound it wandered
between the two for seconds at a time. ``cpus="shared"`` leaves the scheduler free.

Nothing outlives a :class:`Testbed`: everything lives in namespaces whose only
long-lived member is a keeper, keepers exit when the testbed closes or its creating thread
dies (``PR_SET_PDEATHSIG``), and the kernel then frees the namespaces, their veth pairs
and their tmpfs. Processes run *in* a host (:meth:`Host.popen`, forked ranks) get the same
death signal.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence

from ringtree.closing import Closing

__all__ = ["Host", "Testbed", "available", "cpu_shares", "parse_rate"]

SUBNET = "10.77.0"           # hosts get SUBNET.1, .2, ... (private, inside our namespaces)
_KEEPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_keeper.py")
_NS_FLAGS = {"net": 0x40000000, "uts": 0x04000000, "mnt": 0x00020000}
_PR_SET_PDEATHSIG = 1
_available: tuple[bool, str] | None = None


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent (thread) exits."""
    _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def parse_rate(rate: str | float | int) -> float:
    """Bits per second from ``tc``-style text (``1gbit``, ``200mbit``, ``64kbit``) or a
    number (already bit/s)."""
    if isinstance(rate, (int, float)):
        return float(rate)
    s = rate.strip().lower()
    for suffix, mult in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
        if s.endswith(suffix):
            try:
                return float(s[: -len(suffix)]) * mult
            except ValueError:
                break
    raise ValueError(f"bad rate {rate!r}: expected e.g. 1gbit, 200mbit, 64kbit")


def cpu_shares(cpus: Sequence[int], hosts: int) -> list[frozenset[int]]:
    """Host i's CPUs out of ``cpus``: equal disjoint blocks (host i gets the i-th
    ``len(cpus) // hosts``, the first ``len(cpus) % hosts`` hosts one more) when there are
    at least as many CPUs as hosts, else CPU ``i mod len(cpus)``."""
    cpus = sorted(cpus)
    if not cpus:
        raise ValueError("no CPUs to share")
    if hosts <= len(cpus):
        q, r = divmod(len(cpus), hosts)
        starts = [i * q + min(i, r) for i in range(hosts + 1)]
        return [frozenset(cpus[starts[i]:starts[i + 1]]) for i in range(hosts)]
    return [frozenset([cpus[i % len(cpus)]]) for i in range(hosts)]


def available() -> tuple[bool, str]:
    """``(True, "")`` if this process can build a testbed, else ``(False, reason)``."""
    global _available
    if _available is not None:
        return _available
    reason = ""
    if not sys.platform.startswith("linux"):
        reason = "the testbed needs Linux namespaces"
    elif os.geteuid() != 0:
        reason = "the testbed needs root (network namespaces, veth, tc)"
    else:
        missing = [t for t in ("ip", "tc", "nsenter") if shutil.which(t) is None]
        if missing:
            reason = f"the testbed needs {', '.join(missing)} (iproute2, util-linux)"
    if not reason:
        try:
            k = _Keeper("probe", "num")
            k.close()
        except OSError as e:
            reason = f"cannot create namespaces here: {e}"
    _available = (not reason, reason)
    return _available


class _Keeper:
    """One keeper process: the namespaces exist exactly as long as it does."""

    def __init__(self, name: str, flags: str):
        self.proc = subprocess.Popen(
            [sys.executable, _KEEPER, name, flags], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, start_new_session=True,
            preexec_fn=die_with_parent)
        line = self.proc.stdout.readline().strip() if self.proc.stdout else ""
        if not line.startswith("ready"):
            self.close()
            raise OSError(line or f"namespace keeper exited with {self.proc.returncode}")
        self.pid = self.proc.pid

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()


class Host:
    """One namespace host: ``name`` (its host name), ``addr`` on ``ifname``, ``index``."""

    def __init__(self, testbed: Testbed, index: int, name: str, addr: str, rate: float | None,
                 cpus: frozenset[int] | None = None):
        self.testbed, self.index, self.name, self.addr = testbed, index, name, addr
        self.ifname = "eth0"
        self.port = f"p{index}"      # its port on the bridge
        self.rate = rate             # bit/s each way, None if unshaped
        self.cpus = cpus             # the CPUs its processes are bound to (None: all)
        self._keeper = _Keeper(name, "num")
        self.pid = self._keeper.pid

    def bind(self) -> None:
        """Bind the calling process (and so what it starts) to this host's CPUs."""
        if self.cpus is not None:
            os.sched_setaffinity(0, self.cpus)

    def _child_setup(self) -> None:
        die_with_parent()
        self.bind()

    def __repr__(self) -> str:
        return f"Host({self.index}, {self.name!r}, {self.addr})"

    def command(self, argv: Sequence[str], cwd: str | None = None) -> list[str]:
        """``argv`` wrapped to run inside this host (``nsenter``)."""
        return ["nsenter", "-t", str(self.pid), "-n", "-u", "-m",
                f"--wd={cwd or os.getcwd()}", "--", *argv]

    def run(self, argv: Sequence[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
        """Run ``argv`` in this host and wait (``subprocess.run`` keywords)."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("preexec_fn", self.bind)
        cp = subprocess.run(self.command(argv, kw.pop("cwd", None)), **kw)
        if check and cp.returncode != 0:
            raise RuntimeError(f"on {self.name}: {' '.join(argv)} failed "
                               f"({cp.returncode}): {cp.stderr or cp.stdout}")
        return cp

    def popen(self, argv: Sequence[str], **kw) -> subprocess.Popen:
        """Start ``argv`` in this host; it is killed if the testbed's creator dies and
        terminated when the testbed closes."""
        p = subprocess.Popen(self.command(argv, kw.pop("cwd", None)),
                             preexec_fn=self._child_setup, **kw)
        self.testbed._children.append(p)
        return p

    def spawn(self, fn, *args, **kwargs):
        """Run ``fn(*args, **kwargs)`` in a forked process inside this host (e.g. a switch
        or a server that is not a rank); a ``multiprocessing.Process``, stopped when the
        testbed closes."""
        import multiprocessing as mp

        p = mp.get_context("fork").Process(target=_in_host, args=(self, fn, args, kwargs),
                                           daemon=True)
        p.start()
        self.testbed._spawned.append(p)
        return p

    def enter(self) -> None:
        """Move the calling process into this host's namespaces and onto its CPUs (call
        it in a fresh, single-threaded child, e.g. right after ``fork``)."""
        self.bind()
        libc = _libc()
        cwd = os.getcwd()
        for ns in ("net", "uts", "mnt"):
            fd = os.open(f"/proc/{self.pid}/ns/{ns}", os.O_RDONLY)
            try:
                if libc.setns(fd, _NS_FLAGS[ns]) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns({ns}) into {self.name}: {os.strerror(err)}")
            finally:
                os.close(fd)
        os.chdir(cwd)

    def close(self) -> None:
        self._keeper.close()


def _in_host(host: Host, fn, args: tuple, kwargs: dict) -> None:
    die_with_parent()
    host.enter()
    fn(*args, **kwargs)


class Testbed(Closing):
    """``hosts`` namespace hosts on one bridge, each link shaped to ``rate`` each way.

    ``rate``/``burst`` take ``tc`` units (``"1gbit"``, ``"200mbit"``; burst in bytes or
    ``"256kb"``); the default burst holds 1 ms of traffic (at least 32 KiB), the queue 20 ms.
    ``cpus``: ``"own"`` (each of the ``hosts`` gets its share of this process's CPUs,
    :func:`cpu_shares`; hosts added later get them all) or ``"shared"`` (no binding).
    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, hosts: int = 2, rate: str | float | None = "1gbit",
                 burst: str | int | None = None, name: str = "rt", cpus: str = "own"):
        ok, reason = available()
        if not ok:
            raise OSError(reason)
        if hosts < 0 or hosts > 200:
            raise ValueError(f"hosts must be between 0 and 200, not {hosts}")
        if cpus not in ("own", "shared"):
            raise ValueError(f"cpus must be 'own' or 'shared', not {cpus!r}")
        self._shares = cpu_shares(os.sched_getaffinity(0), hosts) \
            if cpus == "own" and hosts else []
        self.name = name
        self.hosts: list[Host] = []
        self._children: list[subprocess.Popen] = []
        self._spawned: list = []  # multiprocessing.Process objects from Host.spawn
        self._creator = threading.get_ident()
        self._next_port = 29400
        self._closed = False
        self._bridge = _Keeper(f"{name}-bridge", "n")
        try:
            self._ip_bridge(["link", "add", "br0", "type", "bridge"])
            self._ip_bridge(["link", "set", "br0", "up"])
            for _ in range(hosts):
                self.add_host(rate=rate, burst=burst)
        except BaseException:
            self.close()
            raise

    # ---- building ---------------------------------------------------------------------

    def _in_bridge(self, argv: list[str]) -> None:
        cp = subprocess.run(["nsenter", "-t", str(self._bridge.pid), "-n", "--", *argv],
                            capture_output=True, text=True)
        if cp.returncode != 0:
            raise RuntimeError(f"bridge: {' '.join(argv)} failed: {cp.stderr.strip()}")

    def _ip_bridge(self, args: list[str]) -> None:
        self._in_bridge(["ip", *args])

    def add_host(self, rate: str | float | None = "1gbit", burst: str | int | None = None,
                 name: str | None = None) -> Host:
        """One more host on the bridge (``rate=None``: an unshaped link)."""
        i = len(self.hosts)
        bps = None if rate is None else parse_rate(rate)
        host = Host(self, i, name or f"{self.name}-h{i}", f"{SUBNET}.{i + 1}", bps,
                    self._shares[i] if i < len(self._shares) else None)
        self.hosts.append(host)
        self._ip_bridge(["link", "add", host.port, "type", "veth", "peer", "name", "eth0",
                         "netns", str(host.pid)])
        self._ip_bridge(["link", "set", host.port, "master", "br0", "up"])
        host.run(["ip", "addr", "add", f"{host.addr}/24", "dev", "eth0"])
        host.run(["ip", "link", "set", "eth0", "up"])
        if bps is not None:
            self.shape(i, bps, burst)
        return host

    def shape(self, i: int, rate: str | float, burst: str | int | None = None) -> None:
        """(Re)shape host ``i``'s link to ``rate`` in each direction (``tc tbf``)."""
        bps = parse_rate(rate)
        if burst is None:
            burst = max(32 * 1024, int(bps / 8 / 1000))
        tbf = ["tbf", "rate", f"{int(bps)}bit", "burst", str(burst), "latency", "20ms"]
        host = self.hosts[i]
        host.run(["tc", "qdisc", "replace", "dev", "eth0", "root", *tbf])
        self._in_bridge(["tc", "qdisc", "replace", "dev", host.port, "root", *tbf])
        host.rate = bps

    def add_interface(self, i: int, ifname: str, cidr: str) -> str:
        """Give host ``i`` an interface ``ifname`` with address ``cidr`` that no other host
        can reach (a veth whose other end stays down inside the host). Returns the
        address."""
        host = self.hosts[i]
        host.run(["ip", "link", "add", ifname, "type", "veth", "peer", "name", f"{ifname}x"])
        host.run(["ip", "addr", "add", cidr, "dev", ifname])
        host.run(["ip", "link", "set", ifname, "up"])
        return cidr.split("/")[0]

    def route_default(self, gateway_last_octet: int = 254) -> str:
        """Give every host a default route to a gateway on the bridge that forwards
        nothing, so traffic to addresses outside the subnet vanishes silently (as on a
        network with a wrong route) instead of failing at once. Returns the gateway."""
        gw = f"{SUBNET}.{gateway_last_octet}"
        self._ip_bridge(["addr", "add", f"{gw}/24", "dev", "br0"])
        self._in_bridge(["sysctl", "-q", "-w", "net.ipv4.ip_forward=0"])
        # drop rather than answer, so a sender hears nothing (no ICMP, no RST)
        self._in_bridge(["sysctl", "-q", "-w", "net.ipv4.icmp_ratelimit=0"])
        for h in self.hosts:
            h.run(["ip", "route", "replace", "default", "via", gw])
        return gw

    # ---- faults -----------------------------------------------------------------------

    def cut(self, i: int) -> None:
        """Pull host ``i``'s cable: its bridge port goes down (both directions stop)."""
        self._ip_bridge(["link", "set", self.hosts[i].port, "down"])

    def heal(self, i: int) -> None:
        self._ip_bridge(["link", "set", self.hosts[i].port, "up"])

    # ---- use --------------------------------------------------------------------------

    def port(self) -> int:
        """A TCP port not yet handed out by this testbed (for a job's store)."""
        self._next_port += 2
        return self._next_port

    def close(self) -> None:
        """Stop everything started in the hosts and remove every namespace."""
        if self._closed:
            return
        self._closed = True
        for q in self._spawned:
            if q.is_alive():
                q.terminate()
            q.join(timeout=5)
            if q.is_alive():
                q.kill()
                q.join()
        for p in self._children:
            if p.poll() is None:
                p.terminate()
        for p in self._children:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for h in self.hosts:
            h.close()
        self._bridge.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()
