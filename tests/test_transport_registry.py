"""Transports are a registry (:mod:`ringtree.transports.registry`, NCCL's
``ncclTransports[]``): a transport registered in-process — here the in-memory loopback
of ``test_executor_loopback.py`` under the name ``toy``, preferred to shared memory on one
host — is accepted by ``RINGTREE_TRANSPORT``, given peers by the assignment, priced by the
tuner with its own coefficients and run by the executor, with no edit anywhere else."""

from __future__ import annotations

import numpy as np
import pytest
from test_executor_loopback import Loopback, Wire, run_all, submit

from ringtree import api, settings
from ringtree.bootstrap.rendezvous import Peer
from ringtree.ir.program import Collective
from ringtree.runtime.executor import Executor
from ringtree.runtime.planner import Planner, link_kind
from ringtree.transports import registry
from ringtree.transports.assign import build_fabric, routes
from ringtree.transports.base import LinkModel, Setup, Transport, TransportKind
from ringtree.tuning.links import Topology
from ringtree.tuning.tuner import MODELS, choose

# a latency-bound link whose messages cost nothing to post: few, long paths lose
TOY_MODEL = LinkModel(alpha=1e-3, overhead=0.0, beta=1 / 4e9, gamma=1 / 3e9)
TOY_CROWDED = LinkModel(alpha=2e-3, overhead=0.0, beta=1 / 2e9, gamma=1 / 3e9)


class ToyTransport(Loopback, Transport):
    """The loopback as a :class:`Transport` (its file would hold just this)."""

    name = "toy"

    def close(self) -> None:
        self.wire = None


WIRE: list[Wire] = []  # the wire the ranks of one test share


def _open(setup: Setup, peers: list[int], listener) -> Transport:
    return ToyTransport(WIRE[-1], setup.rank)


@pytest.fixture
def toy():
    kind = registry.register(TransportKind(
        "toy", priority=-1, open=_open, model=TOY_MODEL, crowded=TOY_CROWDED, local=True))
    try:
        yield kind
    finally:
        registry.unregister("toy")


def _peers(*hosts: str) -> list[Peer]:
    return [Peer(r, "127.0.0.1", 0, h) for r, h in enumerate(hosts)]


def test_settings_accept_the_name_while_it_is_registered(toy):
    assert settings.load({"RINGTREE_TRANSPORT": "Toy"}).transport == "toy"
    registry.unregister("toy")
    try:
        with pytest.raises(ValueError, match="RINGTREE_TRANSPORT.*expected one of auto, shm, "
                                             "tcp$"):
            settings.load({"RINGTREE_TRANSPORT": "toy"})
    finally:
        registry.register(toy)


def test_the_assignment_takes_it_where_it_can_connect(toy):
    hosts = _peers("a", "a", "b", "a")
    assert routes("auto", hosts, 0) == {"toy": [1, 3], "tcp": [2]}  # before shm
    assert routes("shm", hosts[:2], 0) == {"shm": [1]}
    with pytest.raises(ValueError, match="RINGTREE_TRANSPORT=toy, but rank 2 is on another "
                                         "host .*; use auto or tcp"):
        routes("toy", hosts, 0)


def test_the_tuner_prices_its_links(toy):
    assert MODELS["toy"] == TOY_MODEL and MODELS["toy_crowded"] == TOY_CROWDED
    one_host = (0, 0, 0, 0)
    assert link_kind(one_host, "toy") in ("toy", "toy_crowded")
    assert link_kind(one_host, "auto") == link_kind(one_host, "toy")  # preferred
    assert link_kind((0, 0, 1, 1), "toy") == "tcp"                   # across hosts
    p = Planner(0, 4, one_host, nchannels=1, slice_bytes=1 << 20, algo_enabled={},
                link="toy")
    assert p.model() == TOY_MODEL
    # its α dominates and messages are free: the fewest dependent steps win
    assert choose(Collective.ALL_REDUCE, 8, 4, {"ring", "direct"}, p.model()) == "direct"
    p2 = Planner(0, 4, (0, 0, 1, 1), nchannels=1, slice_bytes=1 << 20, algo_enabled={},
                 link="tcp", transport="toy")
    p2.topology = Topology((0, 0, 1, 1), alpha=90e-6, bandwidth=1e9 / 8, source="test",
                           cpus=64)
    assert p2.model().intra == TOY_MODEL  # inside each host


def test_no_memory_shared_so_no_ll(toy):
    assert not registry.shares_memory("toy") and not registry.shares_memory("auto")
    assert registry.shares_memory("shm") == registry.get("shm").usable()


def test_the_fabric_is_built_over_it_and_the_executor_runs(toy):
    """Four ranks on one host, ``auto``: every peer goes over the toy transport, and an
    all-reduce runs over the fabrics the assignment built."""
    n, listeners = 4, []
    WIRE.append(Wire())
    s = settings.load({})
    ranks = []
    for r in range(n):
        setup = Setup(r, tuple(_peers(*"aaaa")), None, "", b"", b"", 1024, 5.0, s)
        lst = _Listener()
        listeners.append(lst)
        fabric = build_fabric(setup, lst)
        assert {q: t.name for q, t in fabric.routes.items()} == \
            {q: "toy" for q in range(n) if q != r}
        planner = Planner(r, n, (0,) * n, nchannels=1, slice_bytes=1024, algo_enabled={},
                          link=link_kind((0,) * n, s.transport))
        ranks.append(_Rank(r, n, planner, Executor(r, fabric)))
    assert all(lst.closed for lst in listeners)  # no transport took the listener
    xs = [np.arange(1001, dtype=np.int64) * (r + 1) for r in range(n)]
    run_all(ranks, submit(ranks, lambda c: api.for_all_reduce(c, xs[c.rank], "sum", None,
                                                               "ring")))
    want = np.arange(1001, dtype=np.int64) * (n * (n + 1) // 2)
    assert all(np.array_equal(x, want) for x in xs)


class _Listener:
    closed = False

    def close(self) -> None:
        self.closed = True


class _Rank:
    def __init__(self, rank: int, size: int, planner: Planner, ex: Executor) -> None:
        self.rank, self.size, self.planner, self.ex, self.seq = rank, size, planner, ex, 0
