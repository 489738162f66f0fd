"""Tests of the rendezvous key-value store (ringtree.bootstrap.store)."""

from __future__ import annotations

import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from ringtree.bootstrap.store import (
    StoreAuthError,
    StoreClient,
    StoreError,
    StoreServer,
    StoreTimeout,
)
from ringtree.bootstrap.store import client as store_client
from ringtree.bootstrap.store import protocol as store_mod
from ringtree.bootstrap.store.protocol import MAGIC, Op, Status, _decode, _encode, _mac, _recv_frame

TOKEN = "s3cret-token"


def wait_until(pred: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


@pytest.fixture
def server() -> Iterator[StoreServer]:
    srv = StoreServer("127.0.0.1", 0, TOKEN)
    yield srv
    srv.close()


@pytest.fixture
def connect(server: StoreServer) -> Iterator[Callable[..., StoreClient]]:
    clients: list[StoreClient] = []

    def make(token: str = TOKEN, **kw: float) -> StoreClient:
        c = StoreClient("127.0.0.1", server.port, token, **kw)
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.close()


def raw_connect(port: int, token: str | None = TOKEN) -> socket.socket:
    """A raw socket, authenticated with ``token`` (None: only the challenge is read)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    hello = _recv_frame(sock, 1024)
    assert hello.startswith(MAGIC)
    if token is not None:
        cnonce = secrets.token_bytes(32)
        proof = _mac(token.encode(), b"client", hello[8:], cnonce)
        sock.sendall(_encode(Op.HELLO, [cnonce, proof]))
        code, _ = _decode(_recv_frame(sock, 1024))
        assert code == Status.OK
    return sock


def parked(server: StoreServer, key: str) -> bool:
    """White-box: is some request parked on ``key`` in the server?"""
    return bool(server._watchers.get(key))


# ---------------------------------------------------------------------------- basic API


def test_set_get_try_get(connect):
    c = connect()
    c.set("a", b"\x00\x01binary\xff")
    c.set("empty", b"")
    c.set("text", "héllo")  # str values are UTF-8 encoded
    c.set("ba", bytearray(b"xy"))
    assert c.get("a") == b"\x00\x01binary\xff"
    assert c.get("empty") == b""
    assert c.get("text") == "héllo".encode()
    assert c.get("ba") == b"xy"
    assert c.try_get("a") == b"\x00\x01binary\xff"
    assert c.try_get("nope") is None
    c.set("a", b"overwritten")
    assert connect().get("a") == b"overwritten"  # visible to other clients
    c.set("ключ/😀", b"u")  # keys are any UTF-8 string
    assert c.get("ключ/😀") == b"u"


def test_add_counter(connect):
    c = connect()
    assert c.add("n") == 1
    assert c.add("n", 10) == 11
    assert c.add("n", -12) == -1
    assert c.get("n") == b"-1"  # decimal ASCII, readable with get
    c.set("m", b"41")
    assert c.add("m") == 42
    c.set("bad", b"not a number")
    with pytest.raises(StoreError, match="non-integer"):
        c.add("bad")
    assert c.add("n") == 0  # the connection is still usable after an error reply
    with pytest.raises(ValueError):
        c.add("n", 2**63)


def test_check_delete(connect):
    c = connect()
    assert c.check([]) is True
    assert c.check(["x"]) is False
    c.set("x", b"1")
    c.set("y", b"2")
    assert c.check(["x", "y"]) is True
    assert c.check(["x", "y", "z"]) is False
    assert c.delete("x") is True
    assert c.delete("x") is False
    assert c.check(["x"]) is False
    assert c.try_get("x") is None


def test_compare_set(connect):
    c = connect()
    assert c.compare_set("k", None, b"first") == b"first"  # absent + None: set
    assert c.compare_set("k", None, b"again") == b"first"  # present + None: unchanged
    assert c.compare_set("k", b"wrong", b"v2") == b"first"  # mismatch: unchanged
    assert c.compare_set("k", b"first", b"v2") == b"v2"  # match: swapped
    assert c.get("k") == b"v2"
    # torch convention: absent key with an expected value stores nothing, returns expected.
    assert c.compare_set("absent", b"e", b"d") == b"e"
    assert c.try_get("absent") is None


def test_compare_set_is_atomic_across_clients(server, connect):
    winners = []

    def contend(i: int) -> None:
        c = StoreClient("127.0.0.1", server.port, TOKEN)
        if c.compare_set("leader", None, str(i).encode()) == str(i).encode():
            winners.append(i)
        c.close()

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    assert connect().get("leader") == str(winners[0]).encode()


# ---------------------------------------------------------------------------- blocking ops


def test_blocking_get_released_by_set_from_another_client(server, connect):
    getter, setter = connect(), connect()
    result: list[bytes] = []
    t = threading.Thread(target=lambda: result.append(getter.get("late", timeout=30)))
    t.start()
    wait_until(lambda: parked(server, "late"))
    setter.set("late", b"here")
    t.join(10)
    assert result == [b"here"]


def test_blocking_get_released_by_add(server, connect):
    getter, setter = connect(), connect()
    result: list[bytes] = []
    t = threading.Thread(target=lambda: result.append(getter.get("ctr", timeout=30)))
    t.start()
    wait_until(lambda: parked(server, "ctr"))
    setter.add("ctr", 5)
    t.join(10)
    assert result == [b"5"]


def test_get_timeout_names_key(connect):
    c = connect()
    t0 = time.monotonic()
    with pytest.raises(StoreTimeout, match="'missing/key'") as info:
        c.get("missing/key", timeout=0.3)
    elapsed = time.monotonic() - t0
    assert 0.25 <= elapsed < 5
    assert isinstance(info.value, TimeoutError)
    assert isinstance(info.value, StoreError)
    with pytest.raises(StoreTimeout):
        c.get("missing/key", timeout=0)  # zero: just a check
    c.set("after", b"ok")  # the connection survives a timeout answered by the server
    assert c.get("after") == b"ok"


def test_default_timeout_is_the_clients(connect):
    c = connect(timeout=0.2)
    with pytest.raises(StoreTimeout, match="0.2s"):
        c.get("never")


def test_wait_released_and_timeout_names_missing(server, connect):
    waiter, setter = connect(), connect()
    done = threading.Event()
    setter.set("w1", b"")

    def run() -> None:
        waiter.wait(["w1", "w2", "w3"], timeout=30)
        done.set()

    t = threading.Thread(target=run)
    t.start()
    wait_until(lambda: parked(server, "w2") and parked(server, "w3"))
    setter.set("w2", b"")
    assert not done.wait(0.05)  # w3 still missing
    setter.set("w3", b"")
    t.join(10)
    assert done.is_set()

    with pytest.raises(StoreTimeout, match="'nope1'.*'nope2'") as info:
        waiter.wait(["w1", "nope1", "nope2"], timeout=0.2)
    assert "'w1'" not in str(info.value)
    waiter.wait([], timeout=0)  # nothing to wait for


def test_wait_rechecks_deleted_keys(server, connect):
    waiter, setter = connect(), connect()
    done = threading.Event()
    t = threading.Thread(target=lambda: (waiter.wait(["a", "b"], timeout=30), done.set()))
    t.start()
    wait_until(lambda: parked(server, "a") and parked(server, "b"))
    setter.set("a", b"")
    setter.delete("a")
    setter.set("b", b"")
    assert not done.wait(0.1)  # "a" is gone again
    setter.set("a", b"")
    t.join(10)
    assert done.is_set()


# ---------------------------------------------------------------------------- auth


def test_wrong_token_is_refused(server, connect):
    with pytest.raises(StoreAuthError, match="refused the job token.*RINGTREE_TOKEN") as info:
        StoreClient("127.0.0.1", server.port, "not-the-token", connect_timeout=5)
    assert f"127.0.0.1:{server.port}" in str(info.value)
    assert connect().check([]) is True  # server unaffected


def test_wrong_token_requests_are_not_applied(server, connect):
    """A bad HELLO followed by a pipelined SET: refused, disconnected, SET never applied."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    hello = _recv_frame(sock, 1024)
    cnonce = secrets.token_bytes(32)
    bad = _encode(Op.HELLO, [cnonce, _mac(b"wrong", b"client", hello[8:], cnonce)])
    sneaky = _encode(Op.SET, [b"owned", b"by-attacker"])
    sock.sendall(bad + sneaky)
    try:
        code, fields = _decode(_recv_frame(sock, 1024))
        assert code == Status.AUTH_FAILED
        assert b"token" in fields[0]
        assert sock.recv(1) == b""  # disconnected
    except ConnectionResetError:
        pass  # the server may reset a connection with unread pipelined data: also a refusal
    sock.close()
    good = connect()
    assert good.try_get("owned") is None


def test_requests_without_hello_are_not_applied(server, connect):
    sock = raw_connect(server.port, token=None)
    sock.sendall(_encode(Op.SET, [b"owned", b"x"]))
    try:
        code, _ = _decode(_recv_frame(sock, 1024))
        assert code == Status.AUTH_FAILED
    except ConnectionResetError:
        pass
    sock.close()
    assert connect().try_get("owned") is None


def test_client_rejects_a_server_without_the_token():
    """Mutual authentication: a store of another job cannot impersonate ours."""
    with StoreServer("127.0.0.1", 0, "other-job") as other:
        with pytest.raises(StoreAuthError):
            StoreClient("127.0.0.1", other.port, TOKEN, connect_timeout=5)


def test_empty_token_works_when_both_sides_agree():
    with StoreServer("127.0.0.1", 0, "") as srv, StoreClient("127.0.0.1", srv.port, "") as c:
        c.set("k", b"v")
        assert c.get("k") == b"v"


def test_not_a_store_is_reported():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        conn.sendall(b"\x00\x00\x00\x05HTTP/")
        conn.close()

    t = threading.Thread(target=serve)
    t.start()
    with pytest.raises(StoreError, match="not a ringtree store"):
        StoreClient("127.0.0.1", port, TOKEN, connect_timeout=5)
    t.join()
    listener.close()


# ---------------------------------------------------------------------------- robustness


def test_many_threads_add_exact_total(server):
    def work() -> None:
        with StoreClient("127.0.0.1", server.port, TOKEN) as c:
            for _ in range(50):
                c.add("total")

    threads = [threading.Thread(target=work) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with StoreClient("127.0.0.1", server.port, TOKEN) as c:
        assert c.get("total") == b"1600"


def test_shared_client_is_thread_safe(connect):
    c = connect()

    def work(i: int) -> None:
        for j in range(100):
            c.add("shared")
            c.set(f"t{i}/{j}", str(j).encode())

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert c.get("shared") == b"800"
    assert c.check([f"t{i}/{j}" for i in range(8) for j in range(100)])


def test_64_clients_rendezvous_with_hundreds_of_keys(server):
    n = 64
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            with StoreClient("127.0.0.1", server.port, TOKEN, connect_timeout=30) as c:
                for j in range(5):
                    c.set(f"rank{r}/addr{j}", f"{r}:{j}".encode())
                c.add("arrived")
                c.wait([f"rank{p}/addr4" for p in range(n)], timeout=30)
                assert c.get(f"rank{(r + 1) % n}/addr0") == f"{(r + 1) % n}:0".encode()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]
    with StoreClient("127.0.0.1", server.port, TOKEN) as c:
        assert c.get("arrived") == str(n).encode()


def test_client_disconnecting_mid_wait_does_not_break_server(server, connect):
    sock = raw_connect(server.port)
    sock.sendall(_encode(Op.GET, [b"never", store_mod._F64.pack(60.0)]))
    wait_until(lambda: parked(server, "never"))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()  # abrupt: RST with linger 0
    wait_until(lambda: not parked(server, "never"))  # the parked waiter was cleaned up

    # A real client abandoning a blocking get (closed from another thread) is no different.
    c = connect()
    t = threading.Thread(target=lambda: pytest.raises(StoreError, c.get, "never2", timeout=60))
    t.start()
    wait_until(lambda: parked(server, "never2"))
    c._sock.shutdown(socket.SHUT_RDWR)
    t.join(10)
    assert not t.is_alive()
    wait_until(lambda: not parked(server, "never2"))

    other = connect()
    other.set("never", b"ok")
    assert other.get("never") == b"ok"


def test_disconnects_during_handshake_and_garbage(server, connect):
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", server.port))
        s.close()  # before the handshake
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"\xff" * 64)  # garbage length prefix, far beyond the pre-auth limit
    s.close()
    s = raw_connect(server.port)
    s.sendall(b"\x00\x00\x00\x03\x02\x00\x00")  # truncated field: malformed frame
    s.close()
    s = raw_connect(server.port)
    s.sendall(store_mod._LEN.pack(store_mod.MAX_FRAME_BYTES + 1))
    code, fields = _decode(_recv_frame(s, 1 << 16))
    assert code == Status.ERROR and b"exceeds" in fields[0]
    s.close()
    c = connect()
    c.set("still", b"alive")
    assert c.get("still") == b"alive"


def test_server_close_fails_waiting_clients(connect):
    srv = StoreServer("127.0.0.1", 0, TOKEN)
    c = StoreClient("127.0.0.1", srv.port, TOKEN)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            c.get("never", timeout=60)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    wait_until(lambda: parked(srv, "never"))
    srv.close()
    t.join(10)
    assert len(errors) == 1 and isinstance(errors[0], StoreError)
    assert "lost the connection" in str(errors[0])
    with pytest.raises(StoreError, match="dropped and could not be opened again"):
        c.set("x", b"y")  # the broken connection is not reused; one new attempt, refused
    with pytest.raises(StoreError, match="the next one in"):
        c.set("x", b"y")  # and no other attempt until the op deadline has passed
    c.close()
    srv.close()  # idempotent


def test_client_retries_until_the_server_is_up(monkeypatch):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    attempts: list[int] = []
    real_connect = socket.create_connection

    def counting_connect(*args, **kwargs):  # noqa: ANN002, ANN003
        attempts.append(1)
        return real_connect(*args, **kwargs)

    monkeypatch.setattr(store_client.socket, "create_connection", counting_connect)
    result: list[bytes] = []

    def client() -> None:
        with StoreClient("127.0.0.1", port, TOKEN, connect_timeout=20) as c:
            result.append(c.get("hello", timeout=20))

    t = threading.Thread(target=client)
    t.start()
    wait_until(lambda: len(attempts) >= 2)  # refused at least once: the server is not up yet
    with StoreServer("127.0.0.1", port, TOKEN) as srv:
        with StoreClient("127.0.0.1", srv.port, TOKEN) as c:
            c.set("hello", b"world")
        t.join(20)
    assert result == [b"world"]


def test_connect_timeout():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(StoreTimeout, match=f"127.0.0.1:{port}"):
        StoreClient("127.0.0.1", port, TOKEN, connect_timeout=0.3)
    assert time.monotonic() - t0 < 5


def test_port_in_use_is_a_clear_error(server):
    with pytest.raises(StoreError, match=f"cannot listen on 127.0.0.1:{server.port}"):
        StoreServer("127.0.0.1", server.port, TOKEN)


def test_limits_and_types(connect, monkeypatch):
    c = connect()
    with pytest.raises(ValueError, match="key of"):
        c.set("k" * (store_mod.MAX_KEY_BYTES + 1), b"")
    with pytest.raises(TypeError):
        c.set(b"bytes-key", b"")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        c.set("k", 123)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=">= 0"):
        c.get("k", timeout=-1)
    monkeypatch.setattr(store_client, "MAX_VALUE_BYTES", 10)
    with pytest.raises(ValueError, match="exceeds the limit of 10"):
        c.set("k", b"x" * 11)


def test_large_value_roundtrip(connect):
    c = connect()
    blob = secrets.token_bytes(8 << 20)
    c.set("blob", blob)
    assert connect().get("blob") == blob
