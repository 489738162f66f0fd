"""Schedule generators, one algorithm per module. Importing this package registers all."""

from ringtree.schedules import (  # noqa: F401  (registration side effects)
    basic,
    bruck,
    collnet,
    collnet_mc,
    direct,
    halving_doubling,
    hierarchical,
    ring,
    tree,
)
from ringtree.schedules.registry import (
    Options,
    algorithms,
    check,
    generate,
    generate_all,
    generator,
    has,
    options_for,
    register,
)

__all__ = ["Options", "algorithms", "check", "generate", "generate_all", "generator", "has",
           "options_for", "register"]
