"""``ringtree run``: the root cause of a failed job, tagged tracebacks, and the mpirun /
torchrun flags people type (accepted, or refused by name)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.test_launch import child_env, py, run

JOB = """
    import os, signal, sys, time, numpy as np, ringtree
    comm = ringtree.init()  # RINGTREE_TIMEOUT from the test
    x = np.ones(1024, np.float32)
    for i in range(200):
        if i == 5 and comm.rank == 2:
            {action}
        comm.all_reduce(x)
        time.sleep(0.01)
    comm.close()
"""


def _summary(stderr: str) -> str:
    i = stderr.index("ringtree run: ")
    return stderr[i:]


def test_root_cause_is_the_rank_that_left_not_the_first_nonzero_exit():
    proc, _ = run("-n", "4", *py(JOB.format(action="sys.exit(0)")), timeout=120,
                  env=child_env(RINGTREE_TRANSPORT="tcp", RINGTREE_TIMEOUT="60"))
    assert proc.returncode != 0
    s = _summary(proc.stderr)
    assert "root cause (first failure): rank 2 " in s and "exited with code 0" in s, s
    assert "the ranks recorded: rank 2 " in s, s
    # the first rank to fail shows its last lines, tagged
    assert "last lines of rank" in s and "] ringtree.errors." in s, s


def test_root_cause_names_a_stopped_rank():
    proc, _ = run("-n", "3", "--grace", "1", *py(JOB.format(
        action="os.kill(os.getpid(), signal.SIGSTOP)")), timeout=120,
        env=child_env(RINGTREE_TIMEOUT="3"))
    assert proc.returncode != 0
    s = _summary(proc.stderr)
    assert "root cause (first failure): rank 2 " in s and "stuck or stopped" in s, s


def test_stderr_is_tagged_when_not_a_terminal():
    code = "import os, sys; print('oops', os.environ['RANK'], file=sys.stderr)"
    proc, _ = run("-n", "2", *py(code))
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stderr.splitlines()) == ["[0] oops 0", "[1] oops 1"]


PRINT = """
    import json, os
    os.write(1, (json.dumps({"rank": os.environ["RANK"], "cpus": sorted(os.sched_getaffinity(0)),
                             "foo": os.environ.get("FOO"), "bar": os.environ.get("BAR")})
                 + "\\n").encode())  # one write per line: ranks share stdout
"""


def test_mpirun_and_torchrun_flags_are_accepted():
    cpus = sorted(os.sched_getaffinity(0))
    env = child_env(FOO="from-launcher")
    proc, _ = run("-np", "2", "--bind-to", "core", "-x", "FOO", "-x", "BAR=set",
                  "--oversubscribe", "--standalone", *py(PRINT), env=env)
    assert proc.returncode == 0, proc.stderr
    rows = sorted((json.loads(ln) for ln in proc.stdout.splitlines()), key=lambda d: d["rank"])
    assert [d["cpus"] for d in rows] == [[cpus[0]], [cpus[1 % len(cpus)]]]
    assert all(d["foo"] == "from-launcher" and d["bar"] == "set" for d in rows)


def _cpus_by_rank(proc) -> list[list[int]]:
    assert proc.returncode == 0, proc.stderr
    rows = sorted((json.loads(ln) for ln in proc.stdout.splitlines()), key=lambda d: d["rank"])
    return [d["cpus"] for d in rows]


def test_ranks_are_bound_by_default_when_they_fit_the_cpus():
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    proc, _ = run("-n", "2", *py(PRINT), env=child_env(RINGTREE_DEBUG="INFO"))
    assert _cpus_by_rank(proc) == [[cpus[0]], [cpus[1]]]
    assert f"binding: rank 0 on CPU {cpus[0]}, rank 1 on CPU {cpus[1]}" in proc.stderr
    # more ranks than CPUs: left to the kernel, and said so
    proc, _ = run("-n", str(len(cpus) + 1), *py(PRINT), env=child_env(RINGTREE_DEBUG="INFO"))
    assert all(c == cpus for c in _cpus_by_rank(proc))
    assert "binding: not bound" in proc.stderr
    # --bind-to none: never bound, nothing said without RINGTREE_DEBUG
    proc, _ = run("-n", "2", "--bind-to", "none", *py(PRINT))
    assert _cpus_by_rank(proc) == [cpus, cpus]
    assert "binding" not in proc.stderr


@pytest.mark.parametrize("args,message", [
    (("--rdzv-backend", "c10d"), "--rdzv-backend is not supported"),
    (("--max-restarts", "-1"), "--max-restarts must be >= 0"),
    (("--hostfile", "/nonexistent/h"), "--hostfile /nonexistent/h: No such file"),
    (("-H", "a:2,b:x"), "'b:x': slots must be a positive integer"),
    (("--frobnicate",), "unknown option '--frobnicate'"),
    (("--nnodes", "1:2"), "no elastic node ranges"),
    (("-x", "NOT_SET_ANYWHERE_X"), "-x NOT_SET_ANYWHERE_X: not set"),
])
def test_unsupported_flags_are_refused_by_name(args, message):
    proc, _ = run("-n", "1", *args, "true")
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "required: -n" not in proc.stderr, proc.stderr


def test_a_script_runs_with_the_current_python(tmp_path):
    script = tmp_path / "hello.py"  # not executable, no shebang
    script.write_text("import os, sys\n"
                      "os.write(1, f\"hi {os.environ['RANK']} {sys.executable}\\n\".encode())\n")
    proc, _ = run("-n", "2", str(script))
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split("\n")[:2]) == [f"hi 0 {sys.executable}",
                                                     f"hi 1 {sys.executable}"]
