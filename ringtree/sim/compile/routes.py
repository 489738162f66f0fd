"""Every connection's route looked up once per pair of devices, not once per connection.

A tree all-reduce on 131,072 ranks has 4.2 M connections but far fewer pairs of devices
that talk: its 16 channels join the same ranks, and a route that reads no channel is the
route of every channel (:meth:`~ringtree.sim.machine.routing.Router.route` keeps it once,
under channel −1). So the pairs are found with one ``np.unique`` over the connections'
ends, each pair is routed once (on its first connection's channel), and only the pairs
whose route did read the channel are routed per connection. Whether a route reads the
channel is a property of the pair, not of the channel: a walk that made no choice by
channel on one channel makes the same choices on every other, so it never reads one.

What the engines need of the routes — latency, bottleneck and first-hop rate per
connection, and which links more than one connection crosses — is then taken from the
distinct summaries by index (:func:`summaries`), the same objects and floats the
per-connection loop gave.
"""

from __future__ import annotations

from itertools import chain

import numpy as np

from ringtree.sim.compile.wired import connections

__all__ = ["route_links", "route_table", "shared_links", "summaries"]


def route_table(cp, topo, devices: list[int]) -> tuple[list, np.ndarray]:
    """(distinct route summaries, the index of every connection's) for ``cp`` on ``topo``
    (``devices[r]``: the device of rank r), kept in ``cp.memo`` for a sweep's sizes."""
    from ringtree.sim.compile.compiled import _summary

    key = ("route_table", id(topo), tuple(devices))
    got = cp.memo.get(key)
    if got is None or got[0] is not topo:
        by_links = topo.link_paths
        uniq, idx = route_links(cp, topo, devices)
        got = cp.memo[key] = (topo, [_summary(topo, r, by_links) for r in uniq], idx)
    return got[1], got[2]


def route_links(cp, topo, devices: list[int]) -> tuple[list, np.ndarray]:
    """(distinct routes, the index of every connection's): :func:`route_table` without
    the summaries (what the compiled heap reads of a route is its links), kept in
    ``cp.memo``."""
    key = ("route_links", id(topo), tuple(devices))
    got = cp.memo.get(key)
    if got is not None and got[0] is topo:
        return got[1], got[2]
    a, b, cl = connections(cp)
    dev = np.asarray(devices, np.int64)
    a, b = dev[a], dev[b]
    _, first, idx = np.unique(a * len(topo.devices) + b, return_index=True,
                              return_inverse=True)
    idx = idx.reshape(-1)
    uniq, free = [], np.zeros(len(first), bool)
    for i, (x, y, c) in enumerate(zip(*(v[first].tolist() for v in (a, b, cl)))):
        uniq.append(topo.route(x, y, c))
        free[i] = topo.channel_free(x, y)
    rest = np.flatnonzero(~free[idx])
    if len(rest):                      # routes that read the channel: one per connection
        idx[rest] = np.arange(len(uniq), len(uniq) + len(rest))
        uniq.extend(topo.route(x, y, c) for x, y, c in zip(*(v[rest].tolist()
                                                             for v in (a, b, cl))))
    cp.memo[key] = (topo, uniq, idx)
    return uniq, idx


def summaries(cp, topo, devices: list[int]) -> tuple[list, list, list, list, list]:
    """Latency, bottleneck, first-link rate and links of every connection, and whether
    each link of ``topo`` carries more than one connection (a route crosses a link once
    at most in the count: the links of one route are taken as a set)."""
    uniq, idx = route_table(cp, topo, devices)
    at = idx.tolist()
    cols = ([p.latency for p in uniq], [p.bottleneck for p in uniq],
            [p.first for p in uniq], [p.links for p in uniq])
    return (*(list(map(col.__getitem__, at)) for col in cols),
            shared_links(cols[3], idx, len(topo.links)).tolist())


def shared_links(uniq: list, idx: np.ndarray, nlinks: int) -> np.ndarray:
    """Whether each of ``nlinks`` links carries more than one connection (connection i
    on route ``uniq[idx[i]]``, links; a route crosses a link once at most in the count)."""
    w = np.bincount(idx, minlength=len(uniq))
    used = np.flatnonzero(w)
    sets = [set(uniq[i]) for i in used.tolist()]
    flat = np.fromiter(chain.from_iterable(sets), np.int64)
    weight = np.repeat(w[used], [len(x) for x in sets]).astype(np.float64)
    # connections per link: integer sums in float64, exact below 2^53
    return np.bincount(flat, weight, minlength=nlinks) > 1
