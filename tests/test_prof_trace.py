"""Profiler → trace: valid Chrome JSON, nested begin/end, one flow per message, and event
counts that match the ring schedule (2(n−1) sends per rank per all-reduce and slice)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import numpy as np
import pytest

from ringtree import prof
from ringtree.prof import cli, summary, trace
from ringtree.prof.recorder import Ev
from ringtree.testing import raise_first, run_ranks

N = 4
CALLS = 2


def _profiled(comm, directory: str, count: int) -> int:
    x = np.ones(count, np.float32)
    comm.all_reduce(x, algo="ring")          # connections up before profiling
    with prof.profile(directory):
        for _ in range(CALLS):
            comm.all_reduce(x, algo="ring")
    assert np.all(x == N ** (CALLS + 1))
    return comm.size


def _events(directory) -> dict[int, list[np.ndarray]]:
    out = {}
    for r in range(N):
        with np.load(directory / f"rank{r}.npz") as z:
            meta = json.loads(str(z["meta"]))
            out[r] = (meta, z["events0"].copy())
    return out


def _check_trace(t: dict) -> Counter:
    """Begin/end matched per thread, flows paired; returns the count of B events by cat."""
    json.loads(json.dumps(t))  # plain JSON
    assert isinstance(t["traceEvents"], list)
    stacks: dict[tuple, list] = defaultdict(list)
    cats: Counter = Counter()
    for e in t["traceEvents"]:
        assert e["ph"] in ("B", "E", "M", "s", "f"), e
        if e["ph"] in ("B", "E", "s", "f"):
            assert isinstance(e["ts"], float) and e["ts"] >= 0
        if e["ph"] == "B":
            stacks[(e["pid"], e["tid"])].append(e)
            cats[e["cat"]] += 1
        elif e["ph"] == "E":
            st = stacks[(e["pid"], e["tid"])]
            assert st, f"E without B: {e}"
            b = st.pop()
            assert b["name"] == e["name"] and b["ts"] <= e["ts"], (b, e)
    assert not any(stacks.values()), "unclosed B events"
    starts = Counter(e["id"] for e in t["traceEvents"] if e["ph"] == "s")
    ends = Counter(e["id"] for e in t["traceEvents"] if e["ph"] == "f")
    assert set(starts.values()) <= {1} and set(ends.values()) <= {1}
    assert starts.keys() == ends.keys()
    assert len(starts) == t["otherData"]["flows"]
    return cats


@pytest.mark.parametrize("env,count,slices,channels", [
    ({}, 4096, 1, 1),                                                 # one slice per chunk
    ({"RINGTREE_BUFFSIZE": "16384", "RINGTREE_NCHANNELS": "2"}, 16384, 2, 2),
])
def test_ring_all_reduce_trace(tmp_path, env, count, slices, channels):
    raise_first(run_ranks(_profiled, N, str(tmp_path), count, env=env, timeout=90))
    per_rank = _events(tmp_path)
    steps = 2 * N - 1
    for r, (meta, ev) in per_rank.items():
        cm = meta["comms"][0]
        assert cm["dropped"] == 0 and cm["rank"] == r
        assert cm["clock"]["method"] in ("reference", "same-host")
        types = Counter(int(t) for t in ev["type"])
        assert types[Ev.COLL_ENTRY] == types[Ev.COLL_EXIT] == CALLS
        # the ring schedule: 2n−1 steps, 2(n−1) sends and receives, per channel and slice
        assert types[Ev.STEP] == CALLS * channels * steps
        assert types[Ev.SEND] == CALLS * channels * 2 * (N - 1) * slices
        assert types[Ev.RECV_WAIT] == CALLS * channels * 2 * (N - 1) * slices
        assert types[Ev.REDUCE] == CALLS * channels * (N - 1) * slices
        for seq in set(int(s) for s in ev["seq"][ev["type"] == Ev.COLL_ENTRY]):
            sends = ev[(ev["type"] == Ev.SEND) & (ev["seq"] == seq)]
            assert len(sends) == channels * 2 * (N - 1) * slices
            assert set(int(p) for p in sends["peer"]) == {(r + 1) % N}
    t = trace.build(str(tmp_path))
    cats = _check_trace(t)
    messages = N * CALLS * channels * 2 * (N - 1) * slices
    assert t["otherData"]["flows"] == messages
    assert t["otherData"]["unmatched_sends"] == 0 == t["otherData"]["unmatched_recvs"]
    assert cats["coll"] == N * CALLS and cats["step"] == N * CALLS * channels * steps
    assert cats["recv"] == messages
    assert {e["pid"] for e in t["traceEvents"]} == set(range(N))
    names = {e["args"]["name"] for e in t["traceEvents"] if e.get("name") == "thread_name"}
    assert {"collectives", "ch 0"} <= names and (channels == 1 or "ch 1" in names)
    flow = next(e for e in t["traceEvents"] if e["ph"] == "s")
    assert "bw (GB/s)" in flow["args"] and flow["args"]["bytes"] > 0
    coll = next(e for e in t["traceEvents"] if e["ph"] == "B" and e["cat"] == "coll")
    assert coll["name"] == "all_reduce" and coll["args"]["algo"] == "ring"
    assert coll["args"]["bytes"] == count * 4 and "busbw (GB/s)" in coll["args"]
    text = summary.summary(str(tmp_path))
    lines = [ln for ln in text.splitlines() if ln.strip().startswith("ch ")]
    assert len(lines) == channels * steps and all("slowest rank" in ln for ln in lines)
    assert "all_reduce      ring" in text and str(count * 4) in text


def _env_profiled(comm) -> int:
    x = np.arange(1000, dtype=np.float64)
    comm.all_reduce(x)
    comm.broadcast(x, root=1)
    n, r = comm.size, comm.rank
    if r % 2 == 0:                      # two separate sends, received inside one group
        comm.send(x, (r + 1) % n)
        comm.send(x, (r + 1) % n)
    else:
        with comm.group():
            comm.recv(x, (r - 1) % n)
            comm.recv(np.empty_like(x), (r - 1) % n)
    return comm.rank


def test_env_profile_and_cli(tmp_path, capsys):
    d = tmp_path / "prof"
    # RINGTREE_TUNE=model: the trace holds the test's calls only (no measuring calls)
    raise_first(run_ranks(_env_profiled, N, env={"RINGTREE_PROFILE": str(d),
                                                 "RINGTREE_TUNE": "model"}, timeout=90))
    assert sorted(p.name for p in d.iterdir()) == [f"rank{r}.npz" for r in range(N)]
    out = tmp_path / "t.json"
    assert cli.main([str(d), "-o", str(out), "--summary"]) == 0
    text = capsys.readouterr().out
    assert f"wrote {out}" in text and "all_reduce" in text and "broadcast" in text
    assert "slowest rank" in text and "wait" in text and "transfer" in text
    t = json.loads(out.read_text())
    cats = _check_trace(t)
    assert cats["coll"] == 2 * N + 2 * N          # + the sends and receives
    assert t["otherData"]["unmatched_sends"] == 0 == t["otherData"]["unmatched_recvs"]
    assert cli.main([str(tmp_path / "nothing")]) == 2

