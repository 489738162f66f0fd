"""A communicator's in-network side: its link to the switch, and one group per virtual rank.

Enabled with ``RINGTREE_COLLNET_ENABLE=1`` and ``RINGTREE_COLLNET_SWITCH=ADDR:PORT``
(NCCL_COLLNET_ENABLE's name; the address may differ per host — each host's leaf switch in
a two-level tree). Nothing touches the network until the first CollNet call; then every
rank publishes its switch address through the store, and each head joins, in virtual-rank
order (so no two heads wait for each other in opposite orders), the group of every
virtual rank its Program talks to. The members of a group that share a leaf switch are
told to each other, so that leaf knows when its part of the group is complete.

What the executor runs is the single-level schedule (heads talk straight to the
virtual root); a switch tree is the switches' business, as SHARP's aggregation trees are
invisible to NCCL's CollNet plugin.
"""

from __future__ import annotations

from ringtree.ir.program import Collective, Program
from ringtree.switch.client import DEFAULT_CHUNK, DEFAULT_WINDOW, SwitchLink
from ringtree.switch.wire import SwitchError
from ringtree.transports.collnet import CollNetTransport, group_key

HOP_US = 300.0  # a software switch's time per pass, measured on the testbed (docs/collnet.md)


class CollNet:
    """Lazily joined switch groups for one communicator rank."""

    def __init__(self, *, rank: int, size: int, comm_id: str, store, prefix: str,
                 address: str, token: str, timeout: float, fabric=None,
                 window: int = DEFAULT_WINDOW, chunk_bytes: int = DEFAULT_CHUNK,
                 hop_us: float = HOP_US):
        if not address:
            raise ValueError("RINGTREE_COLLNET_ENABLE=1 needs RINGTREE_COLLNET_SWITCH=ADDR:PORT")
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"RINGTREE_COLLNET_SWITCH must be ADDR:PORT, not {address!r}")
        self.rank, self.size, self.comm_id = rank, size, comm_id
        self.store, self.prefix = store, prefix
        self.address, self.token, self.timeout = address, token, float(timeout)
        self.window, self.chunk_bytes = window, chunk_bytes
        self.fabric = fabric
        self.hop_s = hop_us * 1e-6
        self._switches: list[str] | None = None
        self._transport: CollNetTransport | None = None

    def prefer(self, coll, nbytes: int, n: int, enabled, model, opts) -> str:
        """The tuner's choice once the switch's own time is charged: the cost model
        prices a switch like a host link (:func:`ringtree.schedules.stats.host_stats`);
        a software switch also spends ``hop_s`` per pass (up, then down)."""
        from ringtree.schedules import needs_switch
        from ringtree.tuning.tuner import ranking

        ranked = ranking(coll, nbytes, n, enabled, model, opts)
        best_host = next(((a, t) for a, t in ranked if not needs_switch(coll, a)), None)
        best_cn = next(((a, t) for a, t in ranked if needs_switch(coll, a)), None)
        if best_cn is None:
            return best_host[0] if best_host else ranked[0][0]
        if best_host is not None and best_cn[1] + 2 * self.hop_s >= best_host[1]:
            return best_host[0]
        return best_cn[0]

    def switches(self) -> list[str]:
        """Every rank's switch address (published once through the store)."""
        if self._switches is None:
            key = f"{self.prefix}/collnet/switch"
            self.store.set(f"{key}/{self.rank}", self.address.encode())
            self._switches = [self.store.get(f"{key}/{r}").decode() for r in range(self.size)]
        return self._switches

    def transport(self) -> CollNetTransport:
        if self._transport is None:
            self._transport = CollNetTransport(SwitchLink(self.address, self.token,
                                                          self.timeout))
        return self._transport

    def ensure(self, program: Program) -> CollNetTransport:
        """Join the group of every virtual rank ``program`` exchanges with (one per
        collective, and per root for a broadcast: :func:`message_key`)."""
        n = program.nranks
        coll = program.collective.code
        root = program.root if program.collective is Collective.BROADCAST else 0
        peers = sorted({q for ch in program.channels for s in ch
                        for q in (*s.recv_from, *s.send_to) if q >= n})
        t = self.transport()
        if all((v, coll, root) in t.groups for v in peers):
            return t
        virtual = {v.rank: v for v in program.meta.get("virtual_programs", ())}
        switches = self.switches()
        for v in peers:
            if (v, coll, root) in t.groups:
                continue
            vp = virtual.get(v)
            if vp is None or vp.meta.get("virtual") != "switch":
                raise ValueError(f"{program.algo}: rank {v} is not a switch of this schedule")
            members = tuple(vp.meta["members"])
            if any(m >= n for m in members):
                raise ValueError(f"{program.algo}: run the single-level schedule; switch "
                                 f"trees are built by the switches (--parent)")
            me = members.index(self.rank)
            steps = [s for ch in vp.channels for s in ch]
            sends = any(self.rank in s.recv_from for s in steps)
            receives = any(self.rank in s.send_to for s in steps)
            local = 0
            for i, m in enumerate(members):
                if switches[m] == self.address:
                    local |= 1 << i
            key = group_key(self.comm_id, program.algo, v, members, coll, root)
            try:
                g = t.link.join(key, me, len(members), local, window=self.window,
                                chunk_bytes=self.chunk_bytes)
            except SwitchError as e:
                raise SwitchError(f"rank {self.rank}: {e}") from None
            t.add_group((v, coll, root), g, sends, receives)
            if self.fabric is not None:
                self.fabric.add_route(v, t)
        return t

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


def from_env(comm) -> CollNet:
    """The CollNet of ``comm`` from ``RINGTREE_COLLNET_SWITCH`` (and the job token the
    switch admits: ``RINGTREE_COLLNET_TOKEN``, else ``RINGTREE_TOKEN``)."""
    from ringtree.settings import current

    s = current()
    token = s.collnet_token or s.token
    if not token:
        raise ValueError("RINGTREE_COLLNET_ENABLE=1: the switch admits jobs by token; set "
                         "RINGTREE_TOKEN (or RINGTREE_COLLNET_TOKEN) to one it serves")
    hop_us = s.collnet_hop_us if s.collnet_hop_us is not None else HOP_US
    return CollNet(rank=comm.rank, size=comm.size, comm_id=comm.comm_id.hex(),
                   store=comm.store, prefix=comm.prefix,
                   address=(s.collnet_switch or "").strip(),
                   token=token, timeout=comm.timeout, fabric=comm.fabric, hop_us=hop_us)
