"""TCP socket settings: which buffer size a socket asks for, and that it gets it."""

import socket

import pytest

from ringtree.transports import tcp_socket
from ringtree.transports.tcp_socket import SOCKET_BUFFER, buffer_size

MiB = 1 << 20


@pytest.mark.parametrize("want, cap, autotune, expected", [
    (4 * MiB, 4 * MiB, 4 * MiB, 4 * MiB),      # the cap allows it: ask, whatever autotuning
    (4 * MiB, 64 * MiB, 32 * MiB, 4 * MiB),    # reaches
    (4 * MiB, 212992, 4 * MiB, None),          # a stock cap: autotuning goes further
    (4 * MiB, 212992, 6 * MiB, None),
    (4 * MiB, 3 * MiB, 4 * MiB, 3 * MiB),      # the doubled cap beats autotuning's 4 MiB
    (4 * MiB, 0, 0, None),                     # nothing readable: leave the kernel alone
])
def test_buffer_size_asks_only_where_it_gets_more_than_autotuning(want, cap, autotune,
                                                                  expected):
    assert buffer_size(want, cap, autotune) == expected


def _limits(monkeypatch, values: dict[str, int]) -> None:
    monkeypatch.setattr(tcp_socket, "_sysctl", lambda path, field=0: values[path])


def test_the_setting_sizes_both_directions_and_zero_means_autotuning(monkeypatch):
    _limits(monkeypatch, {"core/wmem_max": 8 * MiB, "core/rmem_max": 212992,
                          "ipv4/tcp_wmem": 4 * MiB, "ipv4/tcp_rmem": 6 * MiB})
    monkeypatch.delenv("RINGTREE_SOCKET_BUFFER", raising=False)
    assert tcp_socket._buffers() == [(socket.SO_SNDBUF, SOCKET_BUFFER)]
    monkeypatch.setenv("RINGTREE_SOCKET_BUFFER", str(2 * MiB))
    assert tcp_socket._buffers() == [(socket.SO_SNDBUF, 2 * MiB)]
    monkeypatch.setenv("RINGTREE_SOCKET_BUFFER", "0")
    assert tcp_socket._buffers() == []


def test_a_tuned_socket_holds_what_was_asked_for(monkeypatch):
    monkeypatch.setattr(tcp_socket, "_BUFFERS", None)
    monkeypatch.delenv("RINGTREE_SOCKET_BUFFER", raising=False)
    asked = dict(tcp_socket._buffers())
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        tcp_socket.tune(s)
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        for opt, size in asked.items():
            assert s.getsockopt(socket.SOL_SOCKET, opt) >= size  # Linux doubles it
    finally:
        s.close()


def _offered() -> list[str]:
    try:
        with open("/proc/sys/net/ipv4/tcp_available_congestion_control") as f:
            return f.read().split()
    except OSError:
        return []


def _cc_of(monkeypatch, value: str | None) -> bytes:
    monkeypatch.setattr(tcp_socket, "_CC", [])
    if value is None:
        monkeypatch.delenv("RINGTREE_SOCKET_CC", raising=False)
    else:
        monkeypatch.setenv("RINGTREE_SOCKET_CC", value)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        kernel = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
        tcp_socket.tune(s)
        got = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
        return got.rstrip(b"\0"), kernel.rstrip(b"\0")
    finally:
        s.close()


@pytest.mark.skipif(not hasattr(socket, "TCP_CONGESTION") or "cubic" not in _offered()
                    or "reno" not in _offered(), reason="needs Linux with cubic and reno")
def test_sockets_take_the_congestion_control_asked_for_or_keep_the_kernels(monkeypatch):
    assert _cc_of(monkeypatch, None)[0] == b"cubic"          # the default
    assert _cc_of(monkeypatch, "reno")[0] == b"reno"
    got, kernel = _cc_of(monkeypatch, "kernel")               # the kernel's choice
    assert got == kernel
    got, kernel = _cc_of(monkeypatch, "no-such-algorithm")    # not offered: the kernel's
    assert got == kernel
    assert tcp_socket.congestion_control() is None


@pytest.mark.parametrize("per, threads, want", [
    (None, None, 1),       # NCCL's defaults: one thread of one socket
    ("4", None, 4),
    ("2", "2", 4),         # NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD
    ("4", "16", 64),       # NCCL's ceiling
])
def test_sockets_per_peer_is_threads_times_sockets_per_thread(monkeypatch, per, threads, want):
    for name, value in (("RINGTREE_NSOCKS_PERTHREAD", per), ("RINGTREE_SOCKET_NTHREADS", threads)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert tcp_socket.sockets_per_peer() == want


@pytest.mark.parametrize("per, threads, named", [
    ("0", "1", "RINGTREE_NSOCKS_PERTHREAD=0"),
    ("1", "0", "RINGTREE_SOCKET_NTHREADS=0"),
    ("1", "17", "RINGTREE_SOCKET_NTHREADS=17"),
    ("8", "16", "RINGTREE_NSOCKS_PERTHREAD=8 x RINGTREE_SOCKET_NTHREADS=16"),
])
def test_too_many_or_no_sockets_is_an_error_naming_the_settings(monkeypatch, per, threads,
                                                                 named):
    monkeypatch.setenv("RINGTREE_NSOCKS_PERTHREAD", per)
    monkeypatch.setenv("RINGTREE_SOCKET_NTHREADS", threads)
    with pytest.raises(ValueError, match=named):
        tcp_socket.sockets_per_peer()
