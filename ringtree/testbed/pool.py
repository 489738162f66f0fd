"""Jobs on a testbed: H hosts × P ranks, each rank a real process inside its host.

:class:`HostPool` is :class:`ringtree.testing.RankPool` with every rank forked into its
host's namespaces first: rank ``r`` runs on the host that ``layout`` gives it (host-major:
ranks 0..P-1 on host 0, ...), rank 0 hosts the store on host 0's address, and the ranks
of one host share that host's ``/dev/shm`` (so they talk over shared memory, and over TCP
to every other host). ``run`` returns each rank's result or exception.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from typing import Any

from ringtree import testing
from ringtree.testbed.netns import Host, Testbed, die_with_parent

__all__ = ["HostPool", "layout_hosts", "run_hosts"]


def layout_hosts(layout: int | Sequence[int], nhosts: int) -> list[int]:
    """Ranks per host: ``P`` (the same on every host) or one count per host."""
    per = [layout] * nhosts if isinstance(layout, int) else list(layout)
    if len(per) > nhosts or any(p < 0 for p in per) or sum(per) == 0:
        raise ValueError(f"layout {layout!r} does not fit {nhosts} host(s)")
    return per


def _host_entry(host: Host, rank: int, n: int, port: int, token: str, env: dict, conn,
                fn: Callable | None) -> None:
    die_with_parent()
    host.enter()
    testing._entry(rank, n, port, token, env, conn, fn)


def _job(testbed: Testbed, layout: int | Sequence[int], env: dict | None,
         host_env: dict[int, dict] | None, token: str | None = None
         ) -> tuple[list[int], Callable[..., tuple]]:
    """(host of each rank, per-rank process arguments but the pipe and the function)."""
    per = layout_hosts(layout, len(testbed.hosts))
    rank_hosts = [h for h, p in enumerate(per) for _ in range(p)]
    n = len(rank_hosts)
    port, token = testbed.port(), token or secrets.token_hex(8)
    master = testbed.hosts[rank_hosts[0]].addr

    def args(r: int, child, fn: Callable | None = None) -> tuple:
        h = rank_hosts[r]
        local = r - rank_hosts.index(h)
        e = {"RINGTREE_MASTER_ADDR": master, "RINGTREE_LOCAL_RANK": local,
             "RINGTREE_LOCAL_WORLD_SIZE": per[h], "RINGTREE_HOST_ID": None,
             **(env or {}), **((host_env or {}).get(h, {}))}
        return (testbed.hosts[h], r, n, port, token, e, child, fn)

    return rank_hosts, args


class HostPool(testing.RankPool):
    """Long-lived ranks spread over testbed hosts; ``run(fn, ...)`` on every rank.

    ``layout``: ranks per host (an int for every host, or a list); ``env``: extra
    environment for every rank (None values unset a variable), ``host_env``: per-host
    extras, e.g. ``{1: {"RINGTREE_SOCKET_IFNAME": "ib0"}}``; ``token``: the job token (a
    fresh one by default), for services such as a switch that must admit the job.
    """

    def __init__(self, testbed: Testbed, layout: int | Sequence[int] = 2,
                 env: dict | None = None, timeout: float = 120.0,
                 host_env: dict[int, dict] | None = None, token: str | None = None):
        self.testbed = testbed
        self.rank_hosts, args = _job(testbed, layout, env, host_env, token)
        self._start(testing._ctx(), len(self.rank_hosts), timeout, _host_entry, args)


def run_hosts(testbed: Testbed, layout: int | Sequence[int], fn: Callable, *args: Any,
              env: dict | None = None, host_env: dict[int, dict] | None = None,
              timeout: float = 120.0, **kwargs: Any) -> list[Any]:
    """One job in fresh processes: ``fn(comm, *args, **kwargs)`` on every rank; each
    rank's result or exception — including one raised while creating the communicator."""
    rank_hosts, pargs = _job(testbed, layout, env, host_env)
    call = testing._Bound(fn, args, kwargs)
    ctx = testing._ctx()
    conns, procs = [], []
    for r in range(len(rank_hosts)):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_host_entry, args=pargs(r, child, call), daemon=True)
        p.start()
        child.close()
        conns.append(parent)
        procs.append(p)
    try:
        return testing._collect(conns, procs, timeout)
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
