"""Figures: matplotlib is optional everywhere, so it is imported in one place.

Every command that can draw (``ringtree algo show --png``, ``ringtree perf plot`` and
``--plot``, ``ringtree sim --plot``, ``ringtree train --plot``) gets pyplot from
:func:`pyplot`, on the non-interactive Agg backend, and a missing matplotlib is one
:class:`FigureUnavailable` whose message says how to install it. :func:`write` is how a
command reports the file it drew, or why it could not.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from types import ModuleType


class FigureUnavailable(ImportError):
    """matplotlib cannot be imported; the message names the feature and the fix."""


def pyplot(what: str = "drawing") -> ModuleType:
    """``matplotlib.pyplot`` on the Agg backend, or :class:`FigureUnavailable`."""
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError as e:
        raise FigureUnavailable(f"{what} needs matplotlib ({e}); install it with: "
                                "pip install 'ringtree[plot]' (or pip install matplotlib)"
                                ) from None
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def write(prog: str, path: str, draw: Callable[[str], None]) -> bool:
    """Call ``draw(path)``; print ``prog: wrote PATH`` and return True, or print why
    matplotlib is missing to stderr and return False."""
    try:
        draw(path)
    except FigureUnavailable as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return False
    print(f"{prog}: wrote {path}")
    return True
