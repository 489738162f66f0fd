"""Who may drive the job's store: where rank 0's store listens, and the token it demands.

The store is the job's control channel — whoever can write it can abort the job or
impersonate a rank — so it is guarded twice:

*Where it listens.* Only where the job must reach it: loopback when every rank runs on this
host (the launcher says so, or the master address is loopback), else the one local address
the master address names. ``0.0.0.0`` only when the master address is not a local address
(a NAT or a name this host cannot resolve to itself).

*The token*, first match wins:

==================  ======================================================================
source              what it is
==================  ======================================================================
argument            ``ringtree.init(token=...)``
``RINGTREE_TOKEN``  set by ``ringtree run`` (random per job) or by the user
launcher secret     per-job random material a launcher puts in every rank's environment and
                    nowhere else: Open MPI's PSM/OFI pre-conditioning key
                    (``OMPI_MCA_orte_precondition_transports``, Open MPI ≤ 4, and
                    ``OMPI_MCA_opal_precondition_transports``). torchrun, Slurm, MPICH/Hydra
                    and PMIx provide none (their job ids are listed by ``squeue``/``ps``).
host file           one host, nothing secret given: rank 0 writes a random token to a file
                    only this user can read (``$XDG_RUNTIME_DIR`` or a 0700 directory under
                    the temp directory, checked for owner and mode), the other ranks read it
derived             several hosts, nothing secret given: hashed from the job id, master
                    address and port. Every rank computes it, and so can anyone who sees
                    those; rank 0 warns once.
==================  ======================================================================

An environment (``/proc/<pid>/environ``) and a 0600 file are readable by the same user and
root only, so the first four keep out every other user; the last keeps apart jobs that
would otherwise collide, nothing more.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import secrets
import socket
import stat
import tempfile
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

from ringtree.bootstrap.environ import get, view

__all__ = ["SECRET_VARS", "StorePlan", "plan_store", "read_host_token", "remove_host_token"]

SECRET_VARS = ("OMPI_MCA_orte_precondition_transports", "OMPI_MCA_opal_precondition_transports")
_warned = False


@dataclass(frozen=True)
class StorePlan:
    """How this rank reaches (and rank 0 serves) the job's store."""

    bind: str          # where rank 0's server listens
    connect: str       # where clients connect
    token: str         # "" while a host-file token is still to be read (rank > 0)
    source: str        # "argument", "RINGTREE_TOKEN", a SECRET_VARS name, "host file", "derived"
    token_file: str | None = None

    @property
    def protected(self) -> bool:
        """True when outsiders (other users) cannot compute the token."""
        return self.source != "derived"


def plan_store(*, rank: int, world_size: int, local_world_size: int, local_known: bool,
               master_addr: str, port: int, token: str | None, job: str | None,
               environ: Mapping[str, str] | None = None) -> StorePlan:
    """Decide bind address, connect address and token for a job whose rank 0 hosts the store.

    ``local_known``: the launcher said how many ranks share this host (not assumed).
    """
    env = view() if environ is None else environ
    one_host = _is_loopback(master_addr) or (local_known and local_world_size == world_size)
    bind = "127.0.0.1" if one_host else bind_address(master_addr)
    connect = "127.0.0.1" if one_host else master_addr
    if token is not None:
        return StorePlan(bind, connect, token, "argument")
    if env.get("RINGTREE_TOKEN"):
        return StorePlan(bind, connect, env["RINGTREE_TOKEN"], "RINGTREE_TOKEN")
    seed = f"{job or ''}|{master_addr}|{port}|{world_size}"
    for name in SECRET_VARS:
        value = env.get(name)
        if value:
            digest = hashlib.sha256(f"ringtree-token|{value}|{seed}".encode()).hexdigest()
            return StorePlan(bind, connect, digest[:32], name)
    if one_host:
        path = _token_path(seed)
        if path is not None:
            tok = _write_host_token(path) if rank == 0 else ""
            return StorePlan(bind, connect, tok, "host file", path)
    digest = hashlib.sha256(f"ringtree-token|{seed}".encode()).hexdigest()
    if rank == 0:
        warn_unprotected(master_addr, port)
    return StorePlan(bind, connect, digest[:32], "derived")


def warn_unprotected(addr: str, port: int) -> None:
    """Say once per process that anyone who can reach the store can drive it."""
    global _warned
    if _warned:
        return
    _warned = True
    warnings.warn(
        f"ringtree: the job's store at {addr}:{port} is protected by a token derived from "
        "public job information (no RINGTREE_TOKEN, and the launcher provides no secret): "
        "anyone who can reach that address can read it and abort the job. Export the same "
        "random RINGTREE_TOKEN on every rank (see the README's security section).",
        RuntimeWarning, stacklevel=3)


def bind_address(master_addr: str) -> str:
    """The local address the master address names, or every interface if it names none."""
    try:
        infos = socket.getaddrinfo(master_addr, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return "0.0.0.0"
    for *_, sockaddr in infos:
        ip = sockaddr[0]
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((ip, 0))  # succeeds only for this host's own addresses
            return ip
        except OSError:
            continue
    return "0.0.0.0"


def _is_loopback(addr: str) -> bool:
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


# ---------------------------------------------------------------------------- host file


def _private_dir() -> str | None:
    """A directory only this user can enter, or None when none can be trusted."""
    uid = os.getuid()
    runtime = get("XDG_RUNTIME_DIR")
    candidates = [runtime] if runtime else []
    candidates.append(os.path.join(tempfile.gettempdir(), f"ringtree-{uid}"))
    for d in candidates:
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        except OSError:
            continue
        try:
            st = os.lstat(d)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o077:
            return d
    return None


def _token_path(seed: str) -> str | None:
    d = _private_dir()
    if d is None:
        return None
    name = hashlib.sha256(f"ringtree-job|{seed}".encode()).hexdigest()[:24]
    return os.path.join(d, f"job-{name}.token")


def _write_host_token(path: str) -> str:
    token = secrets.token_hex(16)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    os.replace(tmp, path)  # replaces a stale file of an earlier job with the same identity
    return token


def read_host_token(path: str, timeout: float, previous: str = "") -> str:
    """The token rank 0 wrote to ``path`` (one different from ``previous``), waiting up to
    ``timeout`` s for it to appear."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd) as f:
                st = os.fstat(f.fileno())
                token = f.read().strip()
            if st.st_uid == os.getuid() and not st.st_mode & 0o077 and token \
                    and token != previous:
                return token
        except OSError:
            pass
        if time.monotonic() >= deadline:
            from ringtree.bootstrap.store import StoreTimeout

            raise StoreTimeout(
                f"rank 0 did not publish the job token in {path} within {timeout:g}s; if the "
                "job spans several hosts, export the same RINGTREE_TOKEN on every rank")
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def remove_host_token(path: str | None) -> None:
    if path is not None:
        try:
            os.unlink(path)
        except OSError:
            pass
