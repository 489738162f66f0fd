"""The one part of ringtree that is compiled: the simulator's event heap
(``ringtree/sim/engines/_heapc.c``, see ``ringtree/sim/engines/native.py``). Optional:
without a C compiler the package installs anyway and the simulator runs the same loop in
Python.
Everything else about the package is in ``pyproject.toml``."""

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "ringtree.sim.engines._heapc", ["ringtree/sim/engines/_heapc.c"],
    # IEEE doubles rounded as Python rounds them: no contraction into fused multiply-adds
    extra_compile_args=["-O2", "-ffp-contract=off", "-fno-fast-math"],
    optional=True)])
