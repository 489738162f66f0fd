"""Run torch's distributed suite against gloo and ringtree and tabulate the difference.

    python -m tests.conformance.run                      # full: WORLD_SIZE 2 and 3
    python -m tests.conformance.run --subset fast        # the CI subset (a few minutes)
    python -m tests.conformance.run -k all_gather_coalesced --world-sizes 2

For every world size it runs the selection three times (each test in torch's own
harness: ``WORLD_SIZE`` spawned ranks, a FileStore rendezvous, torch's per-test timeout):

- ``gloo``: the reference;
- ``ringtree``: ringtree as a plugin backend (``ddp`` and ``subgroup`` features); tests
  whose gate names gloo skip;
- ``ringtree, gloo's gates``: every gate that admits gloo admits ringtree, so ringtree
  runs exactly what gloo runs.

It prints (and with ``--markdown`` writes) the pass / skip / fail counts and the tests
gloo passes that ringtree fails, and exits 1 if there is any such test beyond
``ALLOWED`` (``test_get_backend`` compares the backend's name with ``"gloo"``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUITE = HERE / "torch_suite.py"
SUBSETS = {"fast": HERE / "fast_subset.txt"}
RUNS = (("gloo", "gloo", "native"), ("ringtree", "ringtree", "native"),
        ("ringtree, gloo's gates", "ringtree", "gloo"))
# Tests that can only fail for a backend not named gloo, whatever it does.
ALLOWED = {"test_get_backend": "asserts that the backend's name is the suite's BACKEND, "
                               "which the gates mode makes compare equal to \"gloo\""}


def run_one(backend: str, gates: str, world_size: int, select: list[str], timeout: int,
            log: Path | None) -> dict[str, dict]:
    """One pass of the selection; each test's outcome by name."""
    tmp = Path(tempfile.mkdtemp(prefix="rt-conf-"))
    env = dict(os.environ, BACKEND=backend, WORLD_SIZE=str(world_size), TEMP_DIR=str(tmp),
               RINGTREE_CONFORMANCE_GATES=gates,
               DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(timeout))
    out = tmp / "result.json"
    cmd = [sys.executable, str(SUITE), "--json", str(out), *select]
    try:
        with open(log, "a") if log else open(os.devnull, "w") as f:
            f.write(f"\n==== {backend} gates={gates} WORLD_SIZE={world_size}\n")
            f.flush()
            subprocess.run(cmd, env=env, stdout=f, stderr=f, check=False)
        return json.loads(out.read_text()) if out.exists() else {}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def counts(res: dict[str, dict]) -> str:
    n = {k: sum(1 for r in res.values() if r["outcome"] == k) for k in ("pass", "skip",
                                                                       "fail")}
    return f"{n['pass']} | {n['skip']} | {n['fail']}"


def first_line(detail: str) -> str:
    lines = [ln.strip() for ln in detail.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln or "Exception" in ln or "Timing out" in ln:
            return ln[:160]
    return (lines[-1] if lines else "")[:160]


def table(results: dict[int, dict[str, dict]]) -> tuple[str, int]:
    """Markdown table and the number of unexplained gloo-only passes."""
    rows = ["| WORLD_SIZE | run | pass | skip | fail | gloo passes, this fails |",
            "|---|---|---|---|---|---|"]
    details, bad = [], 0
    for ws, by_run in sorted(results.items()):
        gloo = by_run["gloo"]
        for label, res in by_run.items():
            if label == "gloo":
                rows.append(f"| {ws} | {label} | {counts(res)} | — |")
                continue
            lost = sorted(t for t, r in gloo.items() if r["outcome"] == "pass"
                          and res.get(t, {}).get("outcome") == "fail")
            unexplained = [t for t in lost if t not in ALLOWED]
            bad += len(unexplained)
            rows.append(f"| {ws} | {label} | {counts(res)} | {len(lost)}"
                        f"{' (' + ', '.join(lost) + ')' if lost else ''} |")
            for t in lost:
                why = ALLOWED.get(t) or first_line(res[t]["detail"])
                details.append(f"- WORLD_SIZE {ws}, {label}: `{t}` — {why}")
            skipped = sorted(t for t, r in gloo.items() if r["outcome"] == "pass"
                             and res.get(t, {}).get("outcome") == "skip")
            if skipped:
                details.append(f"- WORLD_SIZE {ws}, {label}: {len(skipped)} tests gloo passes "
                               f"are skipped (gated on the name): {', '.join(skipped)}")
    return "\n".join(rows + [""] + details), bad


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-sizes", type=int, nargs="+", default=[2, 3])
    p.add_argument("--subset", choices=sorted(SUBSETS), help="a named list of tests")
    p.add_argument("-k", action="append", default=[], help="substring of test names")
    p.add_argument("--timeout", type=int, default=90, help="per-test timeout, seconds")
    p.add_argument("--runs", nargs="+", choices=[r[0] for r in RUNS],
                   default=[r[0] for r in RUNS])
    p.add_argument("--log", type=Path, help="append the suite's output here")
    p.add_argument("--markdown", type=Path, help="write the table here")
    p.add_argument("--json", type=Path, help="write every outcome here")
    a = p.parse_args(argv)
    select = [f"-k={k}" for k in a.k]
    if a.subset:
        select.append(f"--tests={SUBSETS[a.subset]}")
    results: dict[int, dict[str, dict]] = {}
    for ws in a.world_sizes:
        results[ws] = {}
        for label, backend, gates in RUNS:
            if label not in a.runs and label != "gloo":
                continue
            t0 = time.monotonic()
            results[ws][label] = run_one(backend, gates, ws, select, a.timeout, a.log)
            print(f"WORLD_SIZE {ws} {label}: {counts(results[ws][label])} "
                  f"(pass | skip | fail) in {time.monotonic() - t0:.0f} s", flush=True)
    text, bad = table(results)
    print(text)
    if a.markdown:
        a.markdown.write_text(text + "\n")
    if a.json:
        a.json.write_text(json.dumps(results, indent=1, sort_keys=True))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
