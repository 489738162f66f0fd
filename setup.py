"""The parts of ringtree that are compiled, both optional: without a C compiler the
package installs anyway and runs the same steps in Python, to the same bits.

- the simulator's event heap (``ringtree/sim/engines/_heapc.c``, see
  ``ringtree/sim/engines/native.py``);
- LL's data path (``ringtree/transports/_llc.c``, see ``ringtree/transports/shm_native.py``):
  publish, wait with the GIL released, and the rank-order fold in one call;
- cross-memory attach (``ringtree/transports/_cma.c``, see
  ``ringtree/transports/shm_cma.py``): ``process_vm_readv`` with the GIL released;
- CRC-32C for the state transfer's checksums (``ringtree/resilience/_crc32c.c``, see
  ``ringtree/resilience/checksum.py``).

Everything else about the package is in ``pyproject.toml``."""

from setuptools import Extension, setup

# IEEE arithmetic rounded as NumPy and Python round it: no contraction into fused
# multiply-adds, no fast-math reassociation
STRICT_FP = ["-ffp-contract=off", "-fno-fast-math"]

setup(ext_modules=[
    Extension("ringtree.sim.engines._heapc", ["ringtree/sim/engines/_heapc.c"],
              extra_compile_args=["-O2", *STRICT_FP], optional=True),
    # -fno-trapping-math: no FP exception is unmasked, so the NaN-propagating selects of
    # the fold may compute every candidate and vectorise; values are rounded the same
    Extension("ringtree.transports._llc", ["ringtree/transports/_llc.c"],
              depends=["ringtree/transports/_stream.h", "ringtree/transports/_ndview.h"], extra_compile_args=["-O3", *STRICT_FP, "-fno-trapping-math"], optional=True),
    Extension("ringtree.transports._cma", ["ringtree/transports/_cma.c"],
              depends=["ringtree/transports/_stream.h"], extra_compile_args=["-O2"], optional=True),
    Extension("ringtree.resilience._crc32c", ["ringtree/resilience/_crc32c.c"],
              extra_compile_args=["-O2"], optional=True),
])
