"""Golden tests of ``ringtree perf`` output against nccl-tests' printf formats (util.cu)."""

from __future__ import annotations

import json

import pytest

from ringtree.perf import format as fmt
from ringtree.perf.flags import Options

# The lines nccl-tests prints, written out by hand from its format strings:
#   "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s\n"
HEADER = [
    "#",
    "#                                                              out-of-place"
    "                       in-place          ",
    "#       size         count      type   redop    root     time   algbw   busbw  #wrong"
    "     time   algbw   busbw  #wrong ",
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)        "
    "     (us)  (GB/s)  (GB/s)         ",
]


def test_header_matches_nccl_tests():
    assert fmt.header() == HEADER


def test_header_cputime_and_timestamps():
    lines = fmt.header(report_cputime=True, report_timestamps=True)
    assert lines[2].split()[6] == "cputime" and lines[2].split()[10] == "cputime"
    assert lines[2].endswith("#wrong           timestamp")
    assert lines[3].endswith(" %Y-%m-%d %H:%M:%S")
    assert len(lines[2]) == len(lines[3])


@pytest.mark.parametrize("value,width,text", [
    (0.0, 6, "  0.00"),
    (0.004, 6, "  0.00"),
    (115.37, 6, "115.37"),
    (1234.5, 6, "1234.5"),
    (123456.7, 6, "123457"),
    (1234567.0, 6, " 1e+06"),
    (9306.7, 7, "9306.70"),
    (14726.53, 7, "14726.5"),
    (111670.4, 7, " 111670"),
    (12345678.0, 7, "1.2e+07"),
    (float("inf"), 6, "   inf"),
])
def test_float_str_is_getFloatStr(value, width, text):
    assert fmt.float_str(value, width) == text


def test_row_layout():
    pre = fmt.row_preamble(1073741824, 268435456, "float", "sum", -1)
    assert pre == "  1073741824     268435456     float     sum      -1"
    body = fmt.row_body(9291.5, 115.56, 115.56, 0)
    assert body == "  9291.50  115.56  115.56       0"
    assert fmt.row_body(12.5, 0.0, 0.0, None) == "    12.50    0.00    0.00    N/A"
    assert fmt.row_body(1.0, 1.0, 1.0, 1234567) == "     1.00    1.00    1.00  1.23457e+06"
    # a full row lines up under the header's columns
    row = pre + body + fmt.row_body(9306.7, 115.37, 115.37, 0)
    assert len(row) == len(HEADER[2].rstrip())
    for a, b in zip(row.split(), ["1073741824", "268435456", "float", "sum", "-1"]):
        assert a == b


def test_rooted_row():
    assert fmt.row_preamble(8, 2, "bfloat16", "none", 3) == \
        "           8             2  bfloat16    none       3"


def test_footer():
    assert fmt.footer(0, 0.39852, "all_reduce_perf") == [
        "# Out of bounds values : 0 OK",
        "# Avg bus bandwidth    : 0.39852 ",
        "#",
        "# Collective test concluded: all_reduce_perf",
        "#",
        "",
    ]
    assert fmt.footer(3, 12.0, "x")[0] == "# Out of bounds values : 3 FAILED"
    assert fmt.footer(0, 12.0, "x", min_bw=20.0)[1] == "# Avg bus bandwidth    : 12 FAILED"
    assert fmt.footer(0, 19.0, "x", min_bw=20.0)[1] == "# Avg bus bandwidth    : 19 OK"


def test_preamble():
    cfg = Options(min_bytes=8, max_bytes=64 << 20, step_factor=4, iters=20)
    ranks = [fmt.RankInfo(r, 0, 1000 + r, "host", r, "0000:00:00", "ringtree 0.1.0")
             for r in range(2)]
    lines = fmt.preamble("ringtree-0.1.0", 100, 100, "all_reduce_perf", cfg, ranks)
    assert lines == [
        "# nccl-tests version ringtree-0.1.0 nccl-headers=100 nccl-library=100",
        "# Collective test starting: all_reduce_perf",
        "# nThread 1 nGpus 1 minBytes 8 maxBytes 67108864 step: 4(factor) warmup iters: 1 "
        "iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0",
        "#",
        "# Using devices",
        "#  Rank  0 Group  0 Pid   1000 on       host device  0 [0000:00:00] ringtree 0.1.0",
        "#  Rank  1 Group  0 Pid   1001 on       host device  1 [0000:00:00] ringtree 0.1.0",
    ]
    step = fmt.preamble("v", 0, 0, "p", Options(blocking=3), [])
    assert "step: 1048576(bytes)" in step[2]
    assert step[3].startswith("# Blocking Enabled: wait and barrier after each outer")


def _report() -> fmt.JsonReport:
    cfg = Options(min_bytes=8, max_bytes=32, step_factor=4, check=1)
    rep = fmt.JsonReport(args=["ringtree", "perf", "all_reduce"],
                         env=fmt.redacted_env({"RINGTREE_TOKEN": "s3cret", "HOME": "/root",
                                               "A_KEY": "k", "PATH": "/a/b"}),
                         library=100, cfg=cfg,
                         devices=[fmt.RankInfo(0, 0, 7, "h", 0, "0000:00:00", "cpu \"x\"")],
                         extra_config={"backend": "ringtree", "collective": "all_reduce"})
    for size in (8, 32):
        rep.begin_row(size, size // 4, "float", "sum", -1)
        rep.body(False, 10.5, 0.001, 0.002, 0)
        rep.body(True, float("nan"), 0.0, 0.0, None)
        rep.end_row(20)
    return rep


def test_json_schema_round_trip(tmp_path):
    text = _report().render(errors=0, avg_busbw=0.001)
    assert text.startswith('{"version":3,"start_time":"')
    assert '"\\/a\\/b"' not in text and "PATH=\\/a\\/b" in text  # nccl-tests escapes '/'
    path = tmp_path / "r.json"
    path.write_text(text)
    doc = fmt.load_json(str(path))
    assert list(doc) == ["version", "start_time", "args", "env", "nccl_version", "config",
                         "results", "out_of_bounds", "average_bus_bandwidth", "errors",
                         "end_time"]
    assert doc["version"] == 3 and doc["nccl_version"] == 100
    cfg = doc["config"]
    assert cfg["minimum_bytes"] == 8 and cfg["maximum_bytes"] == 32 and cfg["step_factor"] == 4
    assert cfg["blocking_collectives"] == "false" and cfg["validation"] == 1
    assert cfg["backend"] == "ringtree"
    assert cfg["devices"] == [{"rank": 0, "group": 0, "pid": 7, "hostname": "h", "device": 0,
                               "device_hex": "0000:00:00", "device_info": 'cpu "x"'}]
    row = doc["results"][1]
    assert (row["size"], row["count"], row["type"], row["redop"], row["root"]) == \
        (32, 8, "float", "sum", "    -1")
    assert row["out_of_place"] == {"time": 10.5, "alg_bw": 0.001, "bus_bw": 0.002,
                                   "nwrong": 0.0}
    assert row["in_place"]["nwrong"] is None and row["in_place"]["time"] != row["in_place"][
        "time"]  # "nan" came back as a float NaN
    assert row["actual_iterations"] == 20 and row["experiment_name"] == ""
    assert doc["out_of_bounds"] == {"count": 0, "okay": "true"}
    assert doc["average_bus_bandwidth"] == {"bandwidth": 0.001, "okay": "unchecked"}
    assert "RINGTREE_TOKEN=<redacted>" in doc["env"] and "A_KEY=<redacted>" in doc["env"]
    assert "HOME=/root" in doc["env"]
    assert '"bandwidth":0.001000' in text  # %lf


def test_json_cputime_key_and_failed_bw():
    rep = _report()
    rep.cfg = Options(cputime=1)
    rep.begin_row(8, 2, "float", "sum", -1)
    rep.body(False, 1.0, 1.0, 1.0, 3)
    rep.end_row(20)
    doc = json.loads(rep.render(errors=2, avg_busbw=1.0, min_bw=5.0))
    assert "cpu_time" in doc["results"][-1]["out_of_place"]
    assert doc["out_of_bounds"]["okay"] == "false"
    assert doc["average_bus_bandwidth"]["okay"] == "false"


def test_open_exclusive_never_overwrites(tmp_path):
    p = tmp_path / "out.json"
    p.write_text("old")
    f, name = fmt.open_exclusive(str(p))
    f.close()
    assert name == str(p) + ".0" and p.read_text() == "old"
    f, name = fmt.open_exclusive(str(p))
    f.close()
    assert name == str(p) + ".1"


def test_timestamp_width():
    assert len(fmt.timestamp(0.0)) == 21
