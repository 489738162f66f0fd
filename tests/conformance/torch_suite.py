"""torch's own distributed test suite (``DistributedTest._DistTestBase``), run against a
backend chosen by the environment — the test class torch's ``test_distributed_spawn``
builds, made here without copying its code.

Environment (read at import: torch's suite decides its skips while it is imported, and
every spawned rank re-imports this module, so it decides them again the same way):

- ``BACKEND``: ``gloo`` or ``ringtree``; ``WORLD_SIZE``; ``TEMP_DIR`` (a scratch
  directory; ``barrier/`` is made in it).
- ``RINGTREE_CONFORMANCE_GATES``: ``native`` (default) — ringtree is a plugin backend
  with the ``ddp`` and ``subgroup`` features, and the suite's gates that name gloo skip
  it; ``gloo`` — every gate that admits gloo admits ringtree, so ringtree runs exactly the
  tests gloo runs (the backend's name compares equal to ``"gloo"`` while the suite
  decides; torch itself still sees ``"ringtree"``).
- ``RINGTREE_CONFORMANCE_START``: ``fork`` (default) or ``spawn`` the ranks.
- ``DISTRIBUTED_TESTS_DEFAULT_TIMEOUT``: torch's per-test timeout in seconds.

Run through :mod:`tests.conformance.run` (which tabulates); directly,
``BACKEND=ringtree WORLD_SIZE=2 TEMP_DIR=$(mktemp -d) python tests/conformance/torch_suite.py
-k test_barrier`` runs unittest's selection.
"""

from __future__ import annotations

import json
import os
import sys
import unittest

import torch.distributed as dist
from torch.testing._internal.common_distributed import DistTestCases

RINGTREE = "ringtree"
BACKEND = os.environ.get("BACKEND", RINGTREE)
GATES = os.environ.get("RINGTREE_CONFORMANCE_GATES", "native")


class GlooGated(str):
    """``"ringtree"`` that compares (and hashes) as ``"gloo"`` too, so each of the suite's
    ``BACKEND == "gloo"`` / ``BACKEND in {"gloo", ...}`` gates admits it."""

    def __eq__(self, other: object) -> bool:
        return other in (RINGTREE, "gloo") if isinstance(other, str) else NotImplemented

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash("gloo")


def _prepare() -> str:
    """Make the suite see ringtree as torch_ucc's runner made it see ucc; return the
    value the suite's ``BACKEND`` must have."""
    if BACKEND != RINGTREE:
        return BACKEND
    import ringtree.torch  # noqa: F401 - registers the backend (in every spawned rank too)

    DistTestCases.backend_feature["plugin"].add(RINGTREE)
    for feature in ("ddp", "subgroup"):
        DistTestCases.backend_feature[feature].add(RINGTREE)
    return GlooGated(RINGTREE) if GATES == "gloo" else RINGTREE


def _import_suite(backend: str):
    """Import torch's suite with ``os.environ["BACKEND"]`` reading as ``backend``."""
    real = os.environ

    class _Env(dict):
        def __getitem__(self, key):
            return backend if key == "BACKEND" else real[key]

        def get(self, key, default=None):
            return backend if key == "BACKEND" else real.get(key, default)

        def __contains__(self, key):
            return key in real

        def __setitem__(self, key, value):
            real[key] = value
            super().__setitem__(key, value)

    os.environ = _Env(real)  # noqa: B003 - only while the suite decides its gates
    try:
        from torch.testing._internal.distributed import distributed_test
    finally:
        os.environ = real  # noqa: B003
    return distributed_test


os.makedirs(os.path.join(os.environ.setdefault("TEMP_DIR", "/tmp"), "barrier"), exist_ok=True)
_suite = _import_suite(_prepare())
assert dist.is_available()


START = os.environ.get("RINGTREE_CONFORMANCE_START", "fork")


class TestDistBackendWithSpawn(_suite.TestDistBackend, _suite.DistributedTest._DistTestBase):
    """torch's test class; ranks are forked (fast: nothing to re-import) or, with
    ``RINGTREE_CONFORMANCE_START=spawn``, spawned as torch's own CI does."""

    def setUp(self):
        super().setUp()
        if START == "spawn":
            self._spawn_processes()
        else:
            import torch.multiprocessing as mp

            self._start_processes(mp.get_context("fork").Process)


# torch's decorators that make every rank exit with a skip code when there is no GPU: the
# test is skipped here instead, sparing the spawn of its ranks (same outcome, same reason).
_GPU_WRAPPERS = ("skip_if_no_gpu.<locals>.wrapper",
                 "skip_if_lt_x_gpu.<locals>.decorator.<locals>.wrapper")


def _needs_gpu(fn) -> bool:
    while fn is not None:
        code = getattr(fn, "__code__", None)
        if code is not None and getattr(code, "co_qualname", "") in _GPU_WRAPPERS:
            return True
        fn = getattr(fn, "__wrapped__", None)
    return False


def _skip_gpu_only_tests(cls) -> None:
    import torch

    if torch.cuda.is_available() or getattr(torch, "xpu", None) and torch.xpu.is_available():
        return
    for name in unittest.TestLoader().getTestCaseNames(cls):
        fn = getattr(cls, name)
        if not getattr(fn, "__unittest_skip__", False) and _needs_gpu(fn):
            setattr(cls, name, unittest.skip("needs a GPU (torch's decorator would skip it "
                                             "in every rank)")(fn))


_skip_gpu_only_tests(TestDistBackendWithSpawn)


class _Record(unittest.TextTestResult):
    """Each test's outcome, for the JSON report."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.outcomes: dict[str, dict] = {}

    def _put(self, test, outcome: str, detail: str = "") -> None:
        self.outcomes[test.id().rsplit(".", 1)[-1]] = {"outcome": outcome,
                                                       "detail": detail[-2000:]}

    def addSuccess(self, test):  # noqa: N802 - unittest's names
        super().addSuccess(test)
        self._put(test, "pass")

    def addSkip(self, test, reason):  # noqa: N802
        super().addSkip(test, reason)
        self._put(test, "skip", str(reason))

    def addFailure(self, test, err):  # noqa: N802
        super().addFailure(test, err)
        self._put(test, "fail", self._exc_info_to_string(err, test))

    def addError(self, test, err):  # noqa: N802
        super().addError(test, err)
        self._put(test, "fail", self._exc_info_to_string(err, test))

    def addExpectedFailure(self, test, err):  # noqa: N802
        super().addExpectedFailure(test, err)
        self._put(test, "pass", "expected failure")

    def addUnexpectedSuccess(self, test):  # noqa: N802
        super().addUnexpectedSuccess(test)
        self._put(test, "fail", "unexpected success")


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-k", action="append", default=[], help="substring of test names")
    p.add_argument("--tests", help="file with one exact test name a line")
    p.add_argument("--json", help="write each test's outcome here")
    p.add_argument("--list", action="store_true", help="print the test names and exit")
    a = p.parse_args(argv)
    loader = unittest.TestLoader()
    names = loader.getTestCaseNames(TestDistBackendWithSpawn)
    if a.list:
        print("\n".join(names))
        return 0
    if a.tests:
        with open(a.tests) as f:
            wanted = {ln.strip() for ln in f if ln.strip() and not ln.startswith("#")}
        names = [n for n in names if n in wanted]
    if a.k:
        names = [n for n in names if any(k in n for k in a.k)]
    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)
    runner = unittest.TextTestRunner(resultclass=_Record, verbosity=2, stream=sys.stderr)
    result = runner.run(suite)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result.outcomes, f, indent=1, sort_keys=True)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
