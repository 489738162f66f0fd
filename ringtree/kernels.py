"""The compiled kernels, loaded only when built from the sources beside them.

Each optional C extension (``setup.py``) carries the digest of the sources it was built
from (``SOURCE_DIGEST``, from a macro ``setup.py`` defines; ``_kernel.h``). A checkout
whose C sources changed after its last build (an editable install after a pull) would
otherwise import a kernel whose entries no longer match the Python that calls them: an
``AttributeError`` at import, or a call with other arguments. :func:`load` compares the
digest with the sources found beside the package; when they differ it warns and returns
None, so the pure path runs, to the same bits, until the kernel is rebuilt. Installed
without its sources (a wheel), a kernel is trusted.

Standard library only: ``setup.py`` reads :data:`KERNELS` and :func:`digest` from this
file without importing the package.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import warnings
from collections.abc import Sequence
from types import ModuleType

# the directory that holds the ringtree package (the paths below are relative to it)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_HEADER = "ringtree/_kernel.h"
# module -> its C file, then the headers it includes (setup.py: sources, depends)
KERNELS: dict[str, tuple[str, ...]] = {
    "ringtree.sim.engines._heapc": ("ringtree/sim/engines/_heapc.c", _HEADER),
    "ringtree.transports._llc": ("ringtree/transports/_llc.c", "ringtree/transports/_stream.h",
                                 "ringtree/transports/_ndview.h", "ringtree/transports/_vm.h",
                                 "ringtree/transports/_direct.h", _HEADER),
    "ringtree.transports._cma": ("ringtree/transports/_cma.c", "ringtree/transports/_stream.h",
                                 "ringtree/transports/_vm.h", _HEADER),
    "ringtree.resilience._crc32c": ("ringtree/resilience/_crc32c.c", _HEADER),
}


def digest(paths: Sequence[str], root: str | None = None) -> str | None:
    """SHA-256 (first 16 hex digits) of the files' bytes in order, the paths relative to
    ``root`` (default: beside the package); None if one is absent."""
    h = hashlib.sha256()
    for path in paths:
        try:
            with open(os.path.join(ROOT if root is None else root, path), "rb") as f:
                h.update(f.read())
        except OSError:
            return None
    return h.hexdigest()[:16]


def stale(name: str, module: ModuleType, root: str | None = None) -> str | None:
    """Why ``module`` (the kernel ``name``) does not match its sources (beside the
    package, or under ``root``), or None."""
    want = digest(KERNELS[name], ROOT if root is None else root)
    have = getattr(module, "SOURCE_DIGEST", "")
    if want is None or have == want:
        return None
    return (f"{name} was built from other sources than those beside it (built from "
            f"{have or 'sources without a digest'}, sources now {want}); the pure-Python "
            f"path runs instead: rebuild with `pip install -e .` or "
            f"`python setup.py build_ext --inplace`")


def load(name: str) -> ModuleType | None:
    """The kernel ``name`` if it was built and matches its sources, else None."""
    try:
        module = importlib.import_module(name)
    except ImportError:  # built without a C compiler
        return None
    why = stale(name, module)
    if why is not None:
        warnings.warn(why, RuntimeWarning, stacklevel=2)
        return None
    return module
