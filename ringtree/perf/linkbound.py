"""The link bound: the least time a collective can take when hosts talk over one link each.

nccl-tests' bus bandwidth normalises a time by what each *rank* must move, which is the
right yardstick when every rank has its own link (``doc/PERFORMANCE.md``). Across hosts
the ranks of a host share its link, and a good algorithm moves each byte over it once:
what a host must send or receive then depends on the hosts, not on the ranks. With ``S``
the nccl-tests size of a row (the larger of a rank's send and receive buffers), ``n``
ranks, ``L`` hosts and ``P_h`` ranks on host h, the busiest host must move (one way; the
link carries ``B`` each way at once):

- all_reduce: ``2(L−1)/L · S``: the host-level all-reduce of one pre-reduced vector per
  host, whose lower bound is a reduce-scatter plus an all-gather (Patarasuk & Yuan,
  "Bandwidth optimal all-reduce algorithms for clusters of workstations", JPDC 69(2),
  2009); it does not depend on how many ranks a host has.
- all_gather and reduce_scatter: ``max_h max(P_h, n−P_h)/n · S``: a host receives the
  other hosts' blocks (reduce_scatter: sends its contribution to them), and sends its own
  at least once (receives the others' sum for its blocks at least once); ``(L−1)/L · S``
  with equal hosts.
- broadcast and reduce: ``S``: every host but the root's receives (sends) the whole
  buffer at least once.
- gather and scatter: ``max((n−P_root)/n, max_h≠root P_h/n) · S``.
- alltoall: ``max_h P_h(n−P_h)/n · S``: a rank's blocks for other hosts cannot be
  combined.
- sendrecv (nccl-tests' ring: rank r sends ``S`` to r+1): ``S`` times the most ranks of
  one host whose successor is on another.

:func:`link_bound` divides by ``B``; ``ringtree perf`` and ``benchmarks/multihost.py``
report a measured time as the fraction ``bound / time`` of it. TCP over Ethernet tops
out near 95% (1448 bytes of payload per 1514-byte frame).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


def host_bytes(coll: str, nbytes: float, nodes: Sequence[int], root: int = 0) -> float:
    """Bytes the busiest host must send or receive over its link for one ``coll`` of
    nccl-tests size ``nbytes``, ranks on hosts ``nodes`` (``nodes[r]``: rank r's host);
    0 on one host."""
    n, per = len(nodes), Counter(nodes)
    hosts = len(per)
    if hosts < 2:
        return 0.0
    if coll == "all_reduce":
        return 2 * (hosts - 1) / hosts * nbytes
    if coll in ("all_gather", "reduce_scatter"):
        return max(max(p, n - p) for p in per.values()) / n * nbytes
    if coll in ("broadcast", "reduce"):
        return float(nbytes)
    if coll in ("gather", "scatter"):
        home = nodes[root]
        return max([(n - per[home]) / n] + [p / n for h, p in per.items() if h != home]) \
            * nbytes
    if coll == "alltoall":
        return max(p * (n - p) for p in per.values()) / n * nbytes
    if coll == "sendrecv":
        leaving = Counter(nodes[r] for r in range(n) if nodes[(r + 1) % n] != nodes[r])
        return max(leaving.values()) * nbytes
    raise ValueError(f"no link bound for collective {coll!r}")


def link_bound(coll: str, nbytes: float, nodes: Sequence[int], bandwidth: float,
               root: int = 0) -> float:
    """Seconds the busiest host's link needs at ``bandwidth`` bytes/s each way
    (:func:`host_bytes`)."""
    if bandwidth <= 0:
        raise ValueError(f"link bandwidth must be positive, got {bandwidth}")
    return host_bytes(coll, nbytes, nodes, root) / bandwidth
