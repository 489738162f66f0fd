"""The structure the design notes claim, measured from the code itself.

- *Layers*: every import (module level or inside a function) goes from a layer to the
  same layer or one below it, in the order of :data:`LAYERS`; the few imports that go
  up are listed in :data:`UPWARD` with the reason each is there.
- *Measures*: module size, cyclomatic complexity (McCabe, as ``ruff``'s C901 counts it)
  and repeated code, each against the bound the design notes quote.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "ringtree"

# Bottom to top. A module belongs to the longest prefix that names it (``ringtree`` names
# the package's ``__init__`` alone, so a new folder must be placed here).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("vocabulary", ("ringtree.errors", "ringtree.ops", "ringtree.dtypes", "ringtree.work",
                    "ringtree.settings", "ringtree.closing", "ringtree.kernels")),
    ("ir", ("ringtree.ir",)),
    ("schedules", ("ringtree.schedules", "ringtree.msccl")),
    ("bootstrap", ("ringtree.bootstrap",)),
    ("transports", ("ringtree.transports", "ringtree.switch.wire", "ringtree.switch.client",
                    "ringtree.switch.conn", "ringtree.switch.slots")),
    ("tuning", ("ringtree.tuning",)),
    ("runtime", ("ringtree.runtime", "ringtree.switch.collnet")),
    ("prof", ("ringtree.prof",)),
    ("api", ("ringtree", "ringtree.communicator", "ringtree.collectives", "ringtree.api",
             "ringtree.failure", "ringtree.testing", "ringtree.resilience")),
    ("tools", ("ringtree.cli", "ringtree.tools", "ringtree.perf", "ringtree.sim",
               "ringtree.torch", "ringtree.ray", "ringtree.switch", "ringtree.testbed")),
    ("apps", ("ringtree.apps",)),
]

# (importer, imported): why the edge goes up.
UPWARD: dict[tuple[str, str], str] = {
    ("ringtree.tuning.links", "ringtree.sim.machine.cluster"):
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
            inside = module == p or (module.startswith(p + ".") and p != "ringtree")
            if inside and len(p) > best:
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


# ---- measures ------------------------------------------------------------------------

MAX_MODULE_LINES = 450
MAX_COMPLEXITY = 15
# Functions allowed above MAX_COMPLEXITY, with their bound and why (none today).
COMPLEX: dict[str, int] = {}
# Runs of RUN_LINES identical code lines that may stand in two places, and why.
RUN_LINES = 6
REPEATED: dict[frozenset[str], str] = {}


def test_no_module_is_longer_than_the_bound():
    long = {str(f.relative_to(ROOT.parent)): n for f in ROOT.rglob("*.py")
            if (n := len(f.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_no_function_is_more_complex_than_the_bound():
    """McCabe complexity as ``ruff``'s C901 counts it."""
    import json
    import subprocess
    import sys

    ruff = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--select", "C901", "--output-format", "json",
         "--config", f"lint.mccabe.max-complexity={MAX_COMPLEXITY}", str(ROOT)],
        capture_output=True, text=True)
    if ruff.returncode not in (0, 1) or not ruff.stdout.strip().startswith("["):
        pytest.skip(f"ruff is not usable here: {ruff.stderr.strip()[:200]}")
    too = {}
    for item in json.loads(ruff.stdout):
        name = re.search(r"`([^`]+)`", item["message"]).group(1)
        where = f"{Path(item['filename']).relative_to(ROOT.parent)}:{name}"
        value = int(re.search(r"\((\d+) >", item["message"]).group(1))
        if value > COMPLEX.get(where, MAX_COMPLEXITY):
            too[where] = value
    assert too == {}


def _code_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text with white space folded) of the lines that count: not blank,
    not comments, docstrings, imports or lone punctuation."""
    skip: set[int] = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            skip.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            skip.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        text = " ".join(line.split())
        if i in skip or not text or text.startswith("#") or not re.search(r"\w", text):
            continue
        out.append((i, text))
    return out


def repeated_runs() -> dict[frozenset[str], int]:
    """Files that share runs of :data:`RUN_LINES` identical code lines (a file with itself
    when a run stands twice in it), with how many such runs they share."""
    where: dict[str, list[str]] = defaultdict(list)
    for f in sorted(ROOT.rglob("*.py")):
        lines = _code_lines(f)
        name = str(f.relative_to(ROOT.parent))
        for k in range(len(lines) - RUN_LINES + 1):
            run = "\n".join(t for _, t in lines[k:k + RUN_LINES])
            where[hashlib.sha1(run.encode()).hexdigest()].append(name)
    shared: dict[frozenset[str], int] = defaultdict(int)
    for files in where.values():
        if not 1 < len(files) <= 8:  # more than eight places: an idiom, not a copy
            continue
        for i in range(len(files)):
            for j in range(i + 1, len(files)):
                shared[frozenset((files[i], files[j]))] += 1
    return dict(shared)


def test_no_code_is_repeated_unless_kept_on_purpose():
    assert sorted(sorted(k) for k in repeated_runs() if k not in REPEATED) == []
