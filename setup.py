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

import importlib.util
import os

from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))
# ringtree/kernels.py (standard library only, read without importing the package): each
# kernel's sources, and the digest it carries so that an out-of-date build is not loaded
_spec = importlib.util.spec_from_file_location("_ringtree_kernels",
                                               os.path.join(HERE, "ringtree", "kernels.py"))
kernels = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kernels)

# IEEE arithmetic rounded as NumPy and Python round it: no contraction into fused
# multiply-adds, no fast-math reassociation
STRICT_FP = ["-ffp-contract=off", "-fno-fast-math"]


def kernel(name: str, flags: list[str]) -> Extension:
    """The optional extension ``name`` from its sources in ``kernels.KERNELS``."""
    sources = kernels.KERNELS[name]
    tag = kernels.digest(sources, HERE)
    return Extension(name, [sources[0]], depends=list(sources[1:]),
                     define_macros=[("RT_SOURCE_DIGEST", f'"{tag}"')],
                     extra_compile_args=flags, optional=True)


setup(ext_modules=[
    kernel("ringtree.sim.engines._heapc", ["-O2", *STRICT_FP]),
    # -fno-trapping-math: no FP exception is unmasked, so the NaN-propagating selects of
    # the fold may compute every candidate and vectorise; values are rounded the same
    kernel("ringtree.transports._llc", ["-O3", *STRICT_FP, "-fno-trapping-math"]),
    kernel("ringtree.transports._cma", ["-O2"]),
    kernel("ringtree.resilience._crc32c", ["-O2"]),
])
