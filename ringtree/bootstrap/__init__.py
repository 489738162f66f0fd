"""Bootstrap: how ranks find each other before any collective runs.

- :mod:`~ringtree.bootstrap.job` — rank, world size and rendezvous address from the launcher;
- :mod:`~ringtree.bootstrap.netif` — the address a rank listens on;
- :mod:`~ringtree.bootstrap.store` — the rendezvous key-value store;
- :mod:`~ringtree.bootstrap.launch` — ``ringtree run``, the launcher.
"""
