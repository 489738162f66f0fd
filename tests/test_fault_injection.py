"""Fault injection beyond kill -9: a TCP connection torn down under a live rank, and the
store unreachable for a while (back within the deadline: no failure; not back: a clear
error on every rank)."""

from __future__ import annotations

import secrets
import socket
import threading
import time

import numpy as np

import ringtree
from ringtree.bootstrap.store import StoreError, StoreServer
from ringtree.errors import RecoveryError
from ringtree.testing import run_ranks


def socket_closed(comm):
    """Rank 1 shuts down every TCP connection it has (as a reset link would): the next
    call fails on every rank with an error, not a timeout; nobody is dead, so the
    agreement's failed set is empty everywhere and the shrunk communicator (new
    connections) keeps all three ranks."""
    import gc

    from ringtree.transports.tcp import TcpTransport

    x = np.ones(1 << 16, np.float32)
    comm.all_reduce(x)  # the connections are up
    comm.agree(1)
    shut = 0
    if comm.rank == 1:
        for t in [o for o in gc.get_objects() if isinstance(o, TcpTransport)]:
            for conn in t.conns.values():
                if conn.sock is not None:
                    conn.sock.shutdown(socket.SHUT_RDWR)
                    shut += 1
    try:
        comm.all_reduce(x, timeout=60)
        err = None
    except ringtree.RingtreeError as e:
        err = type(e).__name__
    comm.revoke()
    value = comm.agree(1)
    failed = comm.failed_ranks()
    child = comm.shrink()
    y = np.full(1 << 16, child.rank + 1, np.float32)
    child.all_reduce(y)
    child.close()
    return shut, err, value, failed, child.size, float(y[0])


def test_a_socket_closed_under_a_rank():
    res = run_ranks(socket_closed, 3, env={"RINGTREE_TRANSPORT": "tcp"}, timeout=120)
    for r, v in enumerate(res):
        assert not isinstance(v, BaseException), f"rank {r}: {v!r}"
        shut, err, value, failed, size, y = v
        assert err is not None and err != "CollectiveTimeout", (r, v)
        assert (value, failed, size, y) == (1, [], 3, 6.0), (r, v)
    assert res[1][0] > 0  # rank 1 did shut connections down


class _StallingProxy:
    """Forwards TCP to the store; ``pause(s)`` (asked over a control port) holds every
    byte in both directions for ``s`` seconds, as a partitioned network would."""

    def __init__(self, target: int):
        self.target = target
        self.resume_at = 0.0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.control = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.control_port = self.control.getsockname()[1]
        self.socks: list[socket.socket] = []
        for fn in (self._accept, self._commands):
            threading.Thread(target=fn, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                a, _ = self.listener.accept()
            except OSError:
                return
            b = socket.create_connection(("127.0.0.1", self.target))
            self.socks += [a, b]
            for src, dst in ((a, b), (b, a)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                while time.monotonic() < self.resume_at:
                    time.sleep(0.01)
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.close()
            except OSError:
                pass

    def _commands(self) -> None:
        while True:
            try:
                c, _ = self.control.accept()
            except OSError:
                return
            with c:
                self.resume_at = time.monotonic() + float(c.recv(64).decode())
                c.sendall(b"ok")

    def close(self) -> None:
        for s in [self.listener, self.control, *self.socks]:
            s.close()


def _pause(port: int, seconds: float) -> None:
    with socket.create_connection(("127.0.0.1", port)) as c:
        c.sendall(str(seconds).encode())
        c.recv(8)


def store_outage(comm, control: int):
    """Short outage (1.5 s, the store's per-request deadline is 4 s) during collectives
    and an agreement: nothing fails. Long outage (9 s): the agreement fails with a
    RecoveryError naming the store on every rank; once the store is back, the client
    (which dropped the connection whose reply did not come) reconnects and works."""
    x = np.ones(1 << 10, np.float32)
    comm.all_reduce(x)
    comm.barrier()
    if comm.rank == 0:
        _pause(control, 1.5)
    comm.barrier()
    for _ in range(5):  # their waits look at the store (the idle check) meanwhile
        comm.all_reduce(x)
    value = comm.agree(1)
    short = (value, comm.failed_ranks(), float(x[0]))
    comm.barrier()
    if comm.rank == 0:
        _pause(control, 9.0)
    back = time.monotonic() + 9.0  # at the latest: the pause began after our barrier
    comm.barrier()
    try:
        comm.agree(1)
        long = "agreed"
    except RecoveryError as e:
        long = str(e)
    time.sleep(max(0.0, back - time.monotonic()) + 0.5)
    end = time.monotonic() + 20  # a failed reconnect is retried after the op deadline
    while True:
        try:
            comm.store.set(f"back/{comm.rank}", b"1")
            break
        except StoreError:
            if time.monotonic() > end:
                raise
            time.sleep(0.2)
    again = comm.store.get(f"back/{(comm.rank + 1) % comm.size}", timeout=30)
    return short, long, again


def test_the_store_unreachable_for_a_while():
    token = secrets.token_hex(8)
    server = StoreServer("127.0.0.1", 0, token)
    proxy = _StallingProxy(server.port)
    env = {"RINGTREE_STORE_EXTERNAL": "1", "RINGTREE_MASTER_PORT": str(proxy.port),
           "RINGTREE_TOKEN": token, "RINGTREE_STORE_OP_TIMEOUT": "4"}
    try:
        res = run_ranks(store_outage, 3, proxy.control_port, env=env, timeout=120)
    finally:
        proxy.close()
        server.close()
    for r, v in enumerate(res):
        assert not isinstance(v, BaseException), f"rank {r}: {v!r}"
        short, long, again = v
        assert short == (1, [], 3.0 ** 6), (r, v)
        assert f"rank {r}: agree: the store is unreachable" in long, (r, long)
        assert again == b"1", (r, v)


def stale_hello(comm):
    """After a shrink, rank 0 opens a connection to rank 1's new listener with a hello
    that is valid for the *old* communicator (its id, its MAC) and sends bytes after it:
    rank 1 must close it without reading them and count it as stale (the flight
    recorder's status: dumps, the doctor), and the new communicator's data are right.
    (Old-epoch messages cannot arrive: a new communicator has a new id, and its shared
    memory segments new names.)"""
    import gc

    from ringtree.prof.flight import status
    from ringtree.transports.tcp import TcpTransport
    from ringtree.transports.tcp_hello import hello

    comm.all_reduce(np.ones(64, np.float32))
    comm.agree(1)
    comm.revoke()
    child = comm.shrink()
    tcp = {t.comm_id: t for t in gc.get_objects() if isinstance(t, TcpTransport)}
    old, new = tcp[comm.comm_id], tcp[child.comm_id]
    stale = None
    if comm.rank == 0:
        stale = socket.create_connection(tuple(new.addresses[1][:2]))
        stale.sendall(hello(old.secret, old.comm_id, 0, 0)
                      + np.full(1 << 10, 7.0, np.float32).tobytes())
    comm.agree(1)  # rank 1 accepts only after the stale hello is there
    y = np.full(1 << 10, child.rank + 1.0, np.float32)
    child.all_reduce(y)
    refused = None
    if stale is not None:
        stale.settimeout(30)
        try:
            refused = stale.recv(16) == b""
        except ConnectionResetError:
            refused = True
        stale.close()
    out = (child.comm_id != comm.comm_id, float(y.min()), float(y.max()), refused,
           status(child)["stale_dropped"])
    child.close()
    return out


def test_an_old_epochs_connection_is_refused_and_counted():
    res = run_ranks(stale_hello, 2, env={"RINGTREE_TRANSPORT": "tcp"}, timeout=60)
    assert res[0] == (True, 3.0, 3.0, True, 0), res
    assert res[1] == (True, 3.0, 3.0, None, 1), res  # dropped unread, counted
