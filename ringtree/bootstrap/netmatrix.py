"""A host × address reachability matrix: ``ringtree doctor --net``, ``ringtree run
--check-net``.

Every participant (a rank of a job for ``doctor --net``, a node's launcher for
``run --check-net``) listens on *each* of its IPv4 interfaces, publishes them through the
job's store with the one address a rank there would advertise (the ``*`` column: what
``RINGTREE_SOCKET_IFNAME`` or the route to the master picks), then connects to every
other host's every address at once (:func:`ringtree.bootstrap.netcheck.probe`). The table
shows, within a few seconds, which answer::

    ringtree network check: 2 hosts; * = the address ranks advertise
    from \\ to   rt-h0 eth0 10.77.0.1*   rt-h1 eth0 10.77.0.2*   rt-h1 ib0 10.78.0.2*
    rt-h0       .                       ok                      no answer within 3 s
    rt-h1       ok                      .                       .

and the check fails (exit code 1) when an advertised address does not answer, with the
message of :func:`ringtree.bootstrap.netcheck.describe_failures`.
"""

from __future__ import annotations

import json
import socket
import sys
from dataclasses import dataclass

from ringtree.bootstrap.environ import export, get
from ringtree.bootstrap.netcheck import PROBE_TIMEOUT, Advert, describe_failures, probe
from ringtree.settings import current

__all__ = ["Matrix", "gather", "main"]


@dataclass
class Matrix:
    hosts: list[str]                          # row labels, one per host
    cols: list[tuple[str, str, str, bool]]    # (host, ifname, address, advertised)
    cells: dict[tuple[str, int], str | None]  # (from host, col) -> None ok / why not
    failures: str                             # "" if every advertised address answered

    def text(self) -> str:
        head = [f"{h} {i} {a}{'*' if adv else ''}" for h, i, a, adv in self.cols]
        rows = [["from \\ to", *head]]
        for h in self.hosts:
            row = [h]
            for j, (ch, _, _, _) in enumerate(self.cols):
                why = self.cells.get((h, j), "") if ch != h else "."
                row.append("ok" if why is None else (why or "."))
            rows.append(row)
        widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
        lines = [f"ringtree network check: {len(self.hosts)} host(s); * = the address "
                 f"ranks advertise"]
        lines += ["   ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.append(self.failures or "every advertised address answers from every host")
        return "\n".join(lines)


def _listeners() -> list[tuple[str, str, socket.socket]]:
    from ringtree.bootstrap.netif import list_interfaces

    out = []
    for name, ip in list_interfaces():
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind((ip, 0))
            s.listen(256)
        except OSError:
            s.close()
            continue
        out.append((name, ip, s))
    return out


def gather(store, prefix: str, index: int, count: int, master_addr: str,
           timeout: float = 60.0, noun: str = "rank") -> Matrix:
    """Run the check as participant ``index`` of ``count`` (collective over the store)."""
    from ringtree.bootstrap.job import host_identity
    from ringtree.bootstrap.netif import select_address

    lst = _listeners()
    try:
        chosen = select_address(None, master_addr)
        me = {"index": index, "host": socket.gethostname(), "host_id": host_identity(),
              "chosen": chosen, "spec": (current().socket_ifname or ""),
              "entries": [(n, ip, s.getsockname()[1]) for n, ip, s in lst]}
        store.set(f"{prefix}/adv/{index}", json.dumps(me))
        advs = [json.loads(store.get(f"{prefix}/adv/{i}", timeout=timeout))
                for i in range(count)]
        targets = [(a["index"], n, ip, port) for a in advs if a["host_id"] != me["host_id"]
                   for n, ip, port in a["entries"] if not ip.startswith("127.")]
        wait = current().check_net_timeout or PROBE_TIMEOUT
        why = probe([(ip, port) for _, _, ip, port in targets], wait)
        mine = [[i, n, w] for (i, n, _, _), w in zip(targets, why)]
        store.set(f"{prefix}/res/{index}", json.dumps(mine))
        results = [json.loads(store.get(f"{prefix}/res/{i}", timeout=timeout + wait))
                   for i in range(count)]
    finally:
        for _, _, s in lst:
            s.close()
    return _build(advs, results, noun)


def _build(advs: list[dict], results: list[list], noun: str) -> Matrix:
    hosts: list[str] = []
    cols: list[tuple[str, str, str, bool]] = []
    for a in advs:
        if a["host"] not in hosts:
            hosts.append(a["host"])
        for n, ip, _ in a["entries"]:
            if ip.startswith("127."):
                continue
            col = (a["host"], n, ip, ip == a["chosen"])
            if not any(c[:3] == col[:3] for c in cols):
                cols.append(col)
            elif col[3]:
                cols[[c[:3] for c in cols].index(col[:3])] = col
    index = {c[:3]: j for j, c in enumerate(cols)}
    cells: dict[tuple[str, int], str | None] = {}
    bad: dict[int, dict[int, str]] = {}
    adverts = []
    for a in advs:
        ifname = next((n for n, ip, _ in a["entries"] if ip == a["chosen"]), "?")
        port = next((p for _, ip, p in a["entries"] if ip == a["chosen"]), 0)
        adverts.append(Advert(a["index"], a["host"], a["chosen"], port, ifname,
                              [(n, ip) for n, ip, _ in a["entries"]], a["host_id"], a["spec"]))
    for src, rows in enumerate(results):
        for dst, n, why in rows:
            d = advs[dst]
            ip = next(ip for nn, ip, _ in d["entries"] if nn == n)
            j = index[(d["host"], n, ip)]
            key = (advs[src]["host"], j)
            if why is not None or key not in cells:  # one failure marks the host's cell
                cells[key] = why
            if why is not None and ip == d["chosen"]:
                bad.setdefault(src, {})[dst] = why
    return Matrix(hosts, cols, cells, describe_failures(adverts, bad, noun) if bad else "")


def _wait_count(store, key: str, n: int, within: float = 10.0) -> None:
    import time

    end = time.monotonic() + within
    while int(store.try_get(key) or 0) < n and time.monotonic() < end:
        time.sleep(0.02)


def launcher_check(addr: str, port: int, token: str, node_rank: int, nnodes: int) -> int:
    """``ringtree run --check-net``: the nodes' launchers run the check among themselves
    before starting any rank; node 0 prints the matrix. 0 if every advertised address
    answers, else 1 (after printing why)."""
    from ringtree.bootstrap.store import StoreClient

    if get("RINGTREE_MASTER_ADDR") is None:
        export({"RINGTREE_MASTER_ADDR": addr})
    with StoreClient(addr, port, token, timeout=60.0) as store:
        m = gather(store, "rt/launch/netcheck", node_rank, nnodes, addr, noun="node")
        store.add("rt/launch/netcheck/done", 1)
        if node_rank == 0:
            print(m.text(), file=sys.stderr, flush=True)
            _wait_count(store, "rt/launch/netcheck/done", nnodes)
        elif m.failures:
            print(f"ringtree run: {m.failures}", file=sys.stderr, flush=True)
    return 1 if m.failures else 0


def main(argv: list[str]) -> int:
    """``ringtree doctor --net``: run as a job (``ringtree run``, torchrun, mpirun, srun)
    with one or more processes per host; rank 0 prints the matrix."""
    from ringtree.bootstrap.job import detect
    from ringtree.bootstrap.store import StoreClient, StoreServer

    env = detect()
    server = None
    if env.world_size == 1:
        server = StoreServer("127.0.0.1", 0, env.token)
    elif env.rank == 0 and not env.store_external:
        server = StoreServer("0.0.0.0", env.master_port, env.token)
    host = "127.0.0.1" if server is not None else env.master_addr
    try:
        with StoreClient(host, server.port if server else env.master_port, env.token,
                         timeout=60.0) as store:
            m = gather(store, "rt/netcheck", env.rank, env.world_size, env.master_addr)
            if env.rank == 0:
                print(m.text(), flush=True)
            elif m.failures:
                print(m.failures, file=sys.stderr, flush=True)
            store.add("rt/netcheck/done", 1)
            if server is not None:  # keep the store up until everyone has read it
                _wait_count(store, "rt/netcheck/done", env.world_size)
    finally:
        if server is not None:
            server.close()
    return 1 if m.failures else 0
