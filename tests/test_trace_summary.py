"""``ringtree trace --summary`` separates time queued behind earlier calls from the time a
call is active, and never shows a component bigger than its whole."""

from __future__ import annotations

import re

import numpy as np

from ringtree.prof import summary
from ringtree.prof.summary import active_starts
from ringtree.prof.trace import Span
from ringtree.testing import raise_first, run_ranks


def _coll(start: int, end: int) -> Span:
    return Span("coll", start, end, 0, -1, 0, 0, 0, 0, 0)


def test_queued_calls_are_active_only_after_the_ones_before_them():
    calls = [_coll(0, 10 * (k + 1)) for k in range(5)]  # all issued at 0, one after another
    begin = active_starts(calls)
    assert [c.end - begin[id(c)] for c in calls] == [10] * 5
    late = [_coll(0, 10), _coll(25, 30)]  # issued after the previous one finished
    begin = active_starts(late)
    assert [c.end - begin[id(c)] for c in late] == [10, 5]
    overtaken = [_coll(0, 50), _coll(1, 20)]  # a later call that finishes first
    begin = active_starts(overtaken)
    assert [c.end - begin[id(c)] for c in overtaken] == [50, 19]


def queued(comm):
    xs = [np.full(1 << 16, comm.rank + 1, np.float32) for _ in range(8)]
    works = [comm.all_reduce(x, async_op=True) for x in xs]
    for w in works:
        w.wait()
    return [float(x[0]) for x in xs]


def test_summary_of_queued_calls(tmp_path):
    res = raise_first(run_ranks(queued, 2, timeout=120, env={"RINGTREE_PROFILE": str(tmp_path)}))
    assert all(v == [3.0] * 8 for v in res)
    text = summary.summary(str(tmp_path))
    assert "issue→done" in text and "active" in text, text
    rows = [ln for ln in text.splitlines() if ln.strip().startswith("all_reduce ")
            and "%" in ln]
    assert rows, text
    for row in rows:
        nums = re.findall(r"(-?[\d.]+)%", row)
        w, t, r = map(float, nums)
        assert all(0.0 <= v <= 100.0 for v in (w, t, r)), row
        assert abs(w + t + r - 100.0) < 0.3, row
        cols = row.split()
        done, active = float(cols[-5]), float(cols[-4])
        assert 0 < active <= done + 1e-6, row
