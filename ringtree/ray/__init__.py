"""ringtree as a ``ray.util.collective`` backend.

    import ray
    import ray.util.collective as col
    import ringtree.ray                        # registers backend "RINGTREE" here

    @ray.remote
    class Worker:
        def __init__(self):
            import ringtree.ray                # ... and in every actor (Ray's rule)

        def setup(self, world_size, rank):
            col.init_collective_group(world_size, rank, backend="RINGTREE",
                                      group_name="grads")

        def step(self, x):                     # NumPy arrays (or torch CPU tensors)
            col.allreduce(x, group_name="grads")
            return x

``create_collective_group`` from the driver works as well. :class:`RingtreeGroup` runs
each call on a ringtree communicator (shared memory between actors on one node, TCP
between nodes) and has a true reduce-scatter, where Ray's gloo group does one all-reduce
per output block. Needs ``pip install 'ringtree[ray]'``.
"""

from __future__ import annotations

try:
    from ray.util.collective.collective_group.base_collective_group import BaseGroup  # noqa: F401
except ImportError as e:  # pragma: no cover - ray is an optional extra
    raise ImportError("ringtree.ray needs Ray: pip install 'ringtree[ray]'") from e

from ringtree.ray.group import BACKEND, RingtreeGroup, register

register()

__all__ = ["BACKEND", "RingtreeGroup", "register"]
