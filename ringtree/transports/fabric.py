"""The fabric: one object the executor talks to, routing each peer to its transport.

Waiting across several transports: when only one transport has work, sleep in its own
``wait``; when several do, alternate short waits so neither starves.
"""

from __future__ import annotations

import numpy as np

from ringtree.transports.base import Request, Transport


class Fabric:
    def __init__(self, routes: dict[int, Transport]):
        self.routes = routes
        self.transports: list[Transport] = []
        for t in routes.values():
            if all(t is not u for u in self.transports):
                self.transports.append(t)

    def transport_for(self, peer: int) -> Transport:
        try:
            return self.routes[peer]
        except KeyError:
            raise ValueError(f"no transport to rank {peer}") from None

    def isend(self, peer: int, channel: int, header: bytes, payload: np.ndarray) -> Request:
        return self.transport_for(peer).isend(peer, channel, header, payload)

    def irecv(self, peer: int, channel: int, header: bytes, into: np.ndarray) -> Request:
        return self.transport_for(peer).irecv(peer, channel, header, into)

    def poll(self) -> bool:
        moved = False
        for t in self.transports:
            moved |= t.poll()
        return moved

    def wait(self, timeout: float) -> None:
        busy = [t for t in self.transports if getattr(t, "pending", lambda: True)()]
        if len(busy) <= 1:
            (busy or self.transports)[0].wait(timeout) if self.transports else None
            return
        for t in busy:
            t.wait(min(timeout, 0.0005))

    def close(self) -> None:
        for t in self.transports:
            t.close()
