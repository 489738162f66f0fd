"""A testbed of namespace hosts: many "machines" on one Linux box, for tests and benchmarks.

- :class:`Testbed` (:mod:`ringtree.testbed.netns`): N hosts, each with its own network, UTS
  and mount namespace (own host name, own tmpfs ``/dev/shm``), joined through veth pairs to
  one bridge, each direction shaped with ``tc tbf``. Needs root, ``ip``, ``tc`` and
  ``nsenter``; :func:`available` says why not.
- :class:`HostPool` / :func:`run_hosts` (:mod:`ringtree.testbed.pool`): a job of
  H hosts × P ranks on it, returning each rank's result or exception, like
  :mod:`ringtree.testing`'s one-host pool.
- ``ringtree testbed`` (:mod:`ringtree.testbed.cli`): the same from a shell.
"""

from ringtree.testbed.netns import Host, Testbed, available, parse_rate

__all__ = ["Host", "Testbed", "available", "parse_rate"]
