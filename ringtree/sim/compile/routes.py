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

import multiprocessing as mp
import os
import pickle
import signal
from itertools import chain

import numpy as np

from ringtree.sim.compile.wired import connections

__all__ = ["route_links", "route_table", "shared_links", "summaries", "walks"]


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
    uniq, free = walks(topo, *(v[first] for v in (a, b, cl)))
    free = np.asarray(free, bool)
    rest = np.flatnonzero(~free[idx])
    if len(rest):                      # routes that read the channel: one per connection
        idx[rest] = np.arange(len(uniq), len(uniq) + len(rest))
        uniq.extend(walks(topo, *(v[rest] for v in (a, b, cl)))[0])
    cp.memo[key] = (topo, uniq, idx)
    return uniq, idx


# from this many walks on, half of them are walked in a forked process (:func:`walks`)
FORK_FROM = 1 << 16


def walks(topo, a: np.ndarray, b: np.ndarray, ch: np.ndarray) -> tuple[list, list]:
    """(route, whether it is the route of every channel) from device a[k] to b[k] on
    channel ch[k], for every k. A route is a function of (a, b, ch) and the topology
    alone (the Router's caches only keep what a walk would give again), so from
    :data:`FORK_FROM` walks on, where this process may use two cores and is not itself a
    worker (:mod:`ringtree.sim.jobs`), the second half is walked in a forked child that
    sends its answers back through a pipe, while this process walks the first; a child
    that fails is walked for here. The routes are the same tuples of the same links."""
    todo = list(zip(a.tolist(), b.tolist(), ch.tolist()))
    half = max(1, len(todo) // 2)
    if len(todo) < FORK_FROM or not _two_cores():
        return _walk(topo, todo)
    first = _walk(topo, todo[:1])                 # the Router built once, before the fork
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:                                  # the child: walk, answer, leave
        code = 1
        try:
            os.close(rd)
            with os.fdopen(wr, "wb") as out:
                pickle.dump(_walk(topo, todo[half:]), out, pickle.HIGHEST_PROTOCOL)
            code = 0
        finally:
            os._exit(code)
    os.close(wr)
    try:
        with os.fdopen(rd, "rb") as got:
            mine = _walk(topo, todo[1:half])
            data = got.read()
    except BaseException:                         # interrupted here: the child too
        os.kill(pid, signal.SIGKILL)
        raise
    finally:
        _, status = os.waitpid(pid, 0)
    theirs = pickle.loads(data) if status == 0 and data else _walk(topo, todo[half:])
    return first[0] + mine[0] + theirs[0], first[1] + mine[1] + theirs[1]


def _walk(topo, todo: list[tuple[int, int, int]]) -> tuple[list, list]:
    routes, free = [], []
    for x, y, c in todo:
        routes.append(topo.route(x, y, c))
        free.append(topo.channel_free(x, y))
    return routes, free


def _two_cores() -> bool:
    """Whether this process may run on two cores and is no daemonic worker."""
    if not hasattr(os, "fork") or mp.current_process().daemon:
        return False
    try:
        return len(os.sched_getaffinity(0)) >= 2
    except AttributeError:
        return (os.cpu_count() or 1) >= 2


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
