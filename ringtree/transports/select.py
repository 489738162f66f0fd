"""Which transport carries each peer: ``RINGTREE_TRANSPORT`` = ``auto`` (default) | ``tcp``.

``auto`` and ``tcp`` both use TCP today for every peer.
"""

from __future__ import annotations

import os

from ringtree.transports.fabric import Fabric
from ringtree.transports.tcp import TcpTransport

CHOICES = ("auto", "tcp")


def transport_choice() -> str:
    choice = os.environ.get("RINGTREE_TRANSPORT", "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise ValueError(f"RINGTREE_TRANSPORT={choice!r}; expected one of {CHOICES}")
    return choice


def build_fabric(core, listener) -> Fabric:
    """Connect ``core`` (a CommCore) to its peers."""
    transport_choice()
    addresses = [(p.host, p.port) for p in core.peers]
    tcp = TcpTransport(core.rank, addresses, listener, core.comm_id, core.secret,
                       connect_timeout=min(core.timeout, 60.0))
    return Fabric({p: tcp for p in range(core.size) if p != core.rank})
