"""``ringtree sim`` end to end, with numbers checked against the α-β closed form."""

from __future__ import annotations

import json

from ringtree.cli import main


def test_cli_ring_numbers(capsys, tmp_path):
    tr = tmp_path / "t.json"
    rc = main(["sim", "all_reduce", "--topology", "ring", "--nodes", "8", "--algo",
               "ring,tree", "-b", "1M", "-e", "2M", "-f", "2", "--trace", str(tr)])
    out = capsys.readouterr().out
    assert rc == 0
    rows = [ln.split() for ln in out.splitlines() if ln and not ln.startswith("#")]
    ring = [r for r in rows if r[0] == "1048576"][0]
    # 14 dependent steps of 1 MiB/8 at 50 GB/s + 500 ns: 14·(2621.44 + 500) ns
    assert ring[:5] == ["1048576", "262144", "float", "sum", "-1"]
    assert float(ring[5]) == 43.70 and ring[-1] == "*"
    assert float(ring[7]) == round(1048576 / 43700.16 * 14 / 8, 2)
    assert "time (us) per algorithm" in out
    assert json.loads((tmp_path / "t.ring.json").read_text())["traceEvents"]


def test_cli_errors(capsys):
    assert main(["sim", "all_reduce", "--algo", "nope", "-b", "8", "-e", "8"]) == 2
    assert main(["sim", "all_reduce", "--topology", "nowhere.json"]) == 2
    rc = main(["sim", "all_reduce", "--topology", "dgx_h100", "--nodes", "2", "--algo",
               "collnet_direct,ring", "-b", "8", "-e", "8", "--model", "fast"])
    out = capsys.readouterr().out
    assert rc == 0 and "collnet_direct: skipped" in out and "no in-network reduction" in out
