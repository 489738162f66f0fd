"""Schedule generators, one algorithm per module. Importing this package registers all."""

from ringtree.schedules import (  # noqa: F401  (registration side effects)
    basic,
    bruck,
    collnet,
    collnet_mc,
    direct,
    halving_doubling,
    hierarchical,
    nvls,
    ring,
    tree,
)
from ringtree.schedules.registry import (
    Algorithm,
    Options,
    algorithms,
    build,
    build_all,
    check,
    generate,
    generate_all,
    generator,
    has,
    needs_switch,
    options_for,
    record,
    register,
)

__all__ = ["Algorithm", "Options", "algorithms", "build", "build_all", "check", "generate",
           "generate_all", "generator", "has", "needs_switch", "options_for", "record",
           "register"]
