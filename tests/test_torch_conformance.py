"""torch's own distributed suite against ringtree: the CI subset
(``tests/conformance/fast_subset.txt``) at WORLD_SIZE 2, plus the monitored-barrier tests
that need three ranks at WORLD_SIZE 3, in both modes, against gloo.

The full run (every test, WORLD_SIZE 2 and 3) is ``python -m tests.conformance.run``;
its table is in docs/torch.md.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
if importlib.util.find_spec("expecttest") is None:  # torch's test utilities need it
    pytest.skip("torch's test suite needs expecttest (pip install expecttest)",
                allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.conformance import run  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(900)]


THREE_RANKS = ["test_monitored_barrier_failure_order", "test_monitored_barrier_wait_all_ranks",
               "test_monitored_barrier_gloo"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    log = tmp_path_factory.mktemp("conformance") / "suite.log"
    subset = [f"--tests={run.SUBSETS['fast']}"]
    three = tmp_path_factory.mktemp("conformance") / "three.txt"
    three.write_text("\n".join(THREE_RANKS) + "\n")
    out = {}
    for label, backend, gates in run.RUNS:
        res = run.run_one(backend, gates, 2, subset, 90, log)
        for t, r in run.run_one(backend, gates, 3, [f"--tests={three}"], 90, log).items():
            res[f"{t} (WORLD_SIZE 3)"] = r
        out[label] = res
    return out, log


def _names() -> list[str]:
    lines = run.SUBSETS["fast"].read_text().splitlines()
    return ([ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]
            + [f"{t} (WORLD_SIZE 3)" for t in THREE_RANKS])


def test_subset_ran(results):
    res, log = results
    for label, outcomes in res.items():
        assert set(outcomes) == set(_names()), f"{label}: missing results (see {log})"


@pytest.mark.parametrize("label", [r[0] for r in run.RUNS[1:]])
def test_ringtree_fails_nothing_gloo_passes(results, label):
    res, log = results
    lost = {t: run.first_line(res[label][t]["detail"]) for t, r in res["gloo"].items()
            if r["outcome"] == "pass" and res[label][t]["outcome"] == "fail"
            and t.split()[0] not in run.ALLOWED}
    assert not lost, f"{label}: gloo passes, ringtree fails: {lost} (log: {log})"


def test_gloo_gates_run_what_gloo_runs(results):
    res, _ = results
    gloo, gated = res["gloo"], res["ringtree, gloo's gates"]
    ran = {t for t, r in gloo.items() if r["outcome"] == "pass"}
    assert ran, "gloo passed nothing: the harness is broken"
    assert ran - set(run.ALLOWED) <= {t for t, r in gated.items() if r["outcome"] == "pass"}
