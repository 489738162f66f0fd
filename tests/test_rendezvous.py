"""Rendezvous failures are named within seconds: duplicate ranks, disagreeing world sizes,
ranks that never arrive (RINGTREE_INIT_TIMEOUT), and a silent store."""

from __future__ import annotations

import socket

import pytest

import ringtree
from ringtree.bootstrap.store import StoreTimeout
from ringtree.errors import CommAborted, RendezvousError
from ringtree.testing import free_port
from tests.rendezvous_helpers import spawn


def _env(rank: int, world: int, port: int, **extra: str) -> dict[str, str]:
    return {"RINGTREE_RANK": str(rank), "RINGTREE_WORLD_SIZE": str(world),
            "RINGTREE_MASTER_ADDR": "127.0.0.1", "RINGTREE_MASTER_PORT": str(port),
            "RINGTREE_TOKEN": "t0ken", "RINGTREE_TIMEOUT": "120", **extra}


def test_duplicate_rank_is_named_on_every_rank():
    port = free_port()
    # the collective timeout is long: only the rendezvous check can end this in time
    res = spawn([_env(0, 3, port), _env(1, 3, port), _env(1, 3, port)], timeout=40)
    assert all(isinstance(r, (RendezvousError, CommAborted)) for r in res), res
    assert sum(isinstance(r, RendezvousError) for r in res) == 1, res
    for r in res:
        assert "rank 1 was started twice" in str(r) and str(r).count("pid ") == 2, r


def test_disagreeing_world_sizes_are_named():
    port = free_port()
    res = spawn([_env(0, 2, port), _env(1, 3, port)], timeout=40)
    for r in res:
        assert isinstance(r, (RendezvousError, CommAborted)), res
        assert "disagree on the world size" in str(r), r
        assert "says 2" in str(r) and "says 3" in str(r), r


def test_missing_rank_is_named_at_the_init_timeout():
    port = free_port()
    extra = {"RINGTREE_INIT_TIMEOUT": "2"}
    res = spawn([_env(0, 3, port, **extra), _env(1, 3, port, **extra)], timeout=40)
    for r in res:
        assert isinstance(r, RendezvousError), res
        assert "rank(s) 2 of 3 never arrived" in str(r) and "RINGTREE_INIT_TIMEOUT" in str(r)


def test_connecting_to_a_silent_listener_follows_the_configured_deadline():
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        port = silent.getsockname()[1]
        env = _env(1, 2, port, RINGTREE_TIMEOUT="2")
        (r,) = spawn([env], timeout=30)
    assert isinstance(r, StoreTimeout), r
    assert f"127.0.0.1:{port}" in str(r) and "within 2s" in str(r)


@pytest.mark.parametrize("bad", [-1, 0, 1e-9, float("nan"), "5", True])
def test_bad_init_timeouts_are_rejected(bad):
    with pytest.raises((ValueError, TypeError), match="timeout"):
        ringtree.init(timeout=bad)


def test_second_init_in_one_process_says_so():
    def twice(comm):
        try:
            ringtree.init()
        except RuntimeError as e:
            return str(e)
        return "no error"

    port = free_port()
    res = spawn([_env(0, 2, port), _env(1, 2, port)], twice, timeout=60)
    for r in res:
        assert isinstance(r, str) and "already called in this process" in r, res
