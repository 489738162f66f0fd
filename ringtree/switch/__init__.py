"""In-network aggregation in software: a SHARP-like switch and the worker's side of it.

``ringtree switch --listen ADDR:PORT`` runs :class:`~ringtree.switch.server.SwitchServer`;
workers reach it through :class:`~ringtree.switch.client.SwitchLink`, and the executor
through the CollNet transport, which makes the switch the *virtual rank* that the
``collnet_direct`` / ``collnet_chain`` schedules send to and receive from.
"""

from ringtree.switch.client import SwitchGroup, SwitchLink
from ringtree.switch.wire import SwitchError, check_call

__all__ = ["SwitchError", "SwitchGroup", "SwitchLink", "check_call"]
