"""MSCCL-IR files: read as the executors read them, checked, written back.

The public corpus (27 files from Azure/msccl-scheduler, Azure/msccl-executor-nccl,
ROCm/rccl and microsoft/TE-CCL, described in the project's reference material) is read
from ``RINGTREE_MSCCL_CORPUS``, or from the reference material's folder beside the checkout;
those tests skip, saying so, where it is absent. The hand-made files below each break one
rule."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ringtree import msccl
from ringtree.ir.check import same_outputs
from ringtree.ir.collectives import Collective
from ringtree.msccl.export import ExportError, from_programs
from ringtree.msccl.program import to_programs
from ringtree.schedules import Options, algorithms, generate_all

CORPUS = Path(os.environ.get("RINGTREE_MSCCL_CORPUS") or
              Path(__file__).resolve().parents[2] / "shared" / "reference" / "msccl-xml")
FILES = sorted(CORPUS.glob("*.xml")) if CORPUS.is_dir() else []
corpus = pytest.mark.skipif(not FILES, reason=f"the MSCCL-IR corpus is not at {CORPUS}")

# a 2-GPU ring all-gather, in place: each GPU sends its chunk and receives the other's
GOOD = """\
<algo name="ring2" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="allgather" inplace="1" outofplace="0" minBytes="0" maxBytes="0">
  <gpu id="0" i_chunks="0" o_chunks="2" s_chunks="0">
    <tb id="0" send="1" recv="1" chan="0">
      <step s="0" type="s" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="0" o_chunks="2" s_chunks="0">
    <tb id="0" send="0" recv="0" chan="0">
      <step s="0" type="s" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
</algo>
"""



def _read(text: str, strict: bool = False):
    return msccl.read_text(text, "t.xml", strict=strict)


def test_a_good_file_reads_with_nothing_to_report():
    algo, findings = _read(GOOD, strict=True)
    assert findings == []
    assert algo.collective is Collective.ALL_GATHER and algo.ngpus == 2
    assert [st.type for st in algo.gpus[1].tbs[0].steps] == ["s", "r"]
    assert algo.buffer_chunks("i", algo.gpus[0]) == 1


def test_what_is_written_reads_back_the_same_and_passes_every_reader():
    algo, _ = _read(GOOD)
    text = msccl.to_text(algo)
    assert "\t" not in text and not text.startswith("<?")
    again, findings = _read(text, strict=True)
    assert again == algo and findings == []


@pytest.mark.parametrize("edit,level,words", [
    (lambda t: '<?xml version="1.0"?>\n' + t, "executor", "t.xml:1: an XML declaration"),
    (lambda t: t.replace('  <gpu id="1"', '\t<gpu id="1"'), "executor", "t.xml:8: a tab"),
    (lambda t: t.replace(' outofplace="0"', ""), "executor", "no attribute 'outofplace'"),
    (lambda t: t.replace('coll="allgather"', 'coll="reduce_scatter"')
     .replace('buf="o"', 'buf="i"').replace('i_chunks="0" o_chunks="2"',
                                            'i_chunks="2" o_chunks="1"'),
     "executor", "'reducescatter'"),
    (lambda t: t.replace('<tb id="0" send="0"', '<tb\nid="0" send="0"'), "executor",
     "spans several lines"),
    (lambda t: t.replace("srcoff=\"1\" dstbuf=\"o\" dstoff=\"1\" cnt=\"1\" depid=\"-1\" "
                         "deps=\"-1\" hasdep=\"0\"/>\n    </tb>\n  </gpu>\n  <gpu id=\"1\"",
                         "srcoff=\"1\" dstbuf=\"o\" dstoff=\"1\" cnt=\"2\" depid=\"-1\" "
                         "deps=\"-1\" hasdep=\"0\"/>\n    </tb>\n  </gpu>\n  <gpu id=\"1\""),
     "error", "(gpu 0 tb 0 step 1): dst chunks 1..2 of buffer 'o', which has 2"),
    (lambda t: t.replace('type="r" srcbuf="o" srcoff="0"', 'type="rx" srcbuf="o" srcoff="0"'),
     "error", "(gpu 1 tb 0 step 1): type='rx' is not an MSCCL step type"),
    (lambda t: t.replace(' cnt="1" depid="-1" deps="-1" hasdep="0"/>\n    </tb>\n  </gpu>\n'
                         '</algo>', ' depid="-1" deps="-1" hasdep="0"/>\n    </tb>\n  </gpu>\n'
                         '</algo>'), "error", "(gpu 1 tb 0 step 1): <step> has no attribute "
     "'cnt'"),
    (lambda t: t.replace('<tb id="0" send="0" recv="0"', '<tb id="0" send="0" recv="-1"'),
     "error", "(gpu 1 tb 0 step 1): a 'r' step in a block with recv=-1"),
    (lambda t: t.replace('<tb id="0" send="1" recv="1" chan="0">',
                         '<tb id="0" send="1" recv="1" chan="3">'), "error",
     "chan=3 is outside nchannels=1"),
])
def test_each_broken_rule_gets_its_own_message(edit, level, words):
    text = edit(GOOD)
    if level == "executor":
        algo, findings = _read(text)          # ringtree reads it, and says what would fail
        assert algo is not None and [f.level for f in findings] == ["executor"]
        assert words in str(findings[0]), findings
        with pytest.raises(msccl.MscclError, match="executor"):
            _read(text, strict=True)
    else:
        with pytest.raises(msccl.MscclError) as e:
            _read(text)
        assert words in str(e.value), str(e.value)


def test_a_dependency_nobody_publishes_and_a_shared_connection_are_errors():
    two_blocks = GOOD.replace(
        '      <step s="1" type="r" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1" cnt="1" '
        'depid="-1" deps="-1" hasdep="0"/>\n    </tb>\n  </gpu>\n  <gpu id="1"',
        '    </tb>\n    <tb id="1" send="1" recv="1" chan="0">\n'
        '      <step s="0" type="r" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1" cnt="1" '
        'depid="0" deps="0" hasdep="0"/>\n    </tb>\n  </gpu>\n  <gpu id="1"')
    with pytest.raises(msccl.MscclError) as e:
        _read(two_blocks)
    text = str(e.value)
    assert "thread blocks 0 and 1 both send to GPU 1 on channel 0" in text
    assert "(gpu 0 tb 1 step 0): waits for step 0 of block 0, which never publishes" in text


def test_text_that_is_not_msccl_ir_names_the_line():
    with pytest.raises(msccl.MscclSyntaxError, match="t.xml:6: </gpu> closes <tb>"):
        _read(GOOD.replace("    </tb>\n  </gpu>\n  <gpu", "    </gpu>\n  </gpu>\n  <gpu", 1))


@corpus
@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_every_public_file_reads_and_writes_back_the_same(path):
    algo, findings = msccl.read(str(path))
    assert algo.ngpus == len(algo.gpus)
    again, more = msccl.read_text(msccl.to_text(algo), "written.xml", strict=True)
    assert again == algo and more == []


# ---- import: Programs the checker proves ------------------------------------------------

# What ringtree's checker finds in the public files; every other file is proven.
REJECTED = {
    # each rank reduces every chunk itself, in its own order: the sums differ in bits
    "allreduce-1step-4n-ll-1pass.xml": "reduced in a different order than rank 0's",
    "allreduce-allpairs-8n-ll-1pass-op.xml": "reduced in a different order than rank 0's",
    # dependencies both ways between channels 0 and 1 (ringtree's channels are ordered)
    "amd_32.xml": "dependencies go from channel 1 to channel 0 and back",
}


def test_a_good_file_becomes_programs_the_checker_proves(tmp_path):
    f = tmp_path / "ring2.xml"
    f.write_text(GOOD)
    imp = msccl.load(str(f))
    assert [p.algo for p in imp.programs] == ["msccl:ring2"] * 2
    assert [str(s) for s in imp.programs[0].channels[0]] == ["send to 1 src=o[0]",
                                                             "recv from 1 dst=o[1]"]
    assert [r.in_place for r in imp.reports] == [True]


def _pairs_file() -> str:
    """3 GPUs, out of place: GPU g adds the input of g+1, then of g+2, to its own, so GPU 0
    computes (in0 + in1) + in2 and GPU 1 (in1 + in2) + in0: the same multiset of inputs
    (msccl-tools' check accepts it), different bits."""
    step = ('      <step s="{s}" type="{t}" srcbuf="{sb}" srcoff="0" dstbuf="{db}" dstoff="0" '
            'cnt="1" depid="{d}" deps="{k}" hasdep="{h}"/>')
    lines = ['<algo name="pairs" proto="Simple" nchannels="1" nchunksperloop="1" ngpus="3" '
             'coll="allreduce" inplace="0" outofplace="1" minBytes="0" maxBytes="0">']
    for g in range(3):
        lines.append(f'  <gpu id="{g}" i_chunks="1" o_chunks="1" s_chunks="0">')
        for tb, (peer, src, dep) in enumerate((((g + 1) % 3, "i", (-1, -1)),
                                                ((g + 2) % 3, "o", (0, 1)))):
            lines.append(f'    <tb id="{tb}" send="{peer}" recv="{peer}" chan="0">')
            lines.append(step.format(s=0, t="s", sb="i", db="i", d=-1, k=-1, h=0))
            lines.append(step.format(s=1, t="rrc", sb=src, db="o", d=dep[0], k=dep[1],
                                     h=int(tb == 0)))
            lines.append("    </tb>")
        lines.append("  </gpu>")
    return "\n".join(lines + ["</algo>", ""])


def test_a_reduction_in_different_orders_is_refused_with_the_file_named(tmp_path):
    f = tmp_path / "pairs.xml"
    f.write_text(_pairs_file())
    msccl.read(str(f), strict=True)  # a well-formed file every executor would load
    with pytest.raises(msccl.MscclError, match=r"pairs.xml: run out of place: .* rank 1 "
                       r"output\[0\] reduced in a different order than rank 0's"):
        msccl.load(str(f))


@corpus
@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_every_public_file_is_proven_or_refused_for_its_reason(path):
    why = REJECTED.get(path.name)
    if why is None:
        imp = msccl.load(str(path))
        assert len(imp.programs) == imp.algo.ngpus and imp.reports
    else:
        with pytest.raises(msccl.MscclError, match=why):
            msccl.load(str(path))


def test_algo_import_exits_zero_only_for_proven_files(tmp_path, capsys):
    from ringtree.tools.algo import main

    good, bad = tmp_path / "ring2.xml", tmp_path / "tab.xml"
    good.write_text(GOOD)
    bad.write_text(GOOD.replace('  <gpu id="1"', '\t<gpu id="1"'))
    assert main(["import", str(good), str(bad)]) == 0
    out = capsys.readouterr().out
    assert "ok   " + str(good) + ": all_gather on 2 GPUs, Simple" in out
    assert "executor: " + str(bad) + ":8: a tab" in out
    assert main(["import", "--strict", str(bad)]) == 1
    assert main(["import", str(tmp_path / "missing.xml")]) == 1


# ---- export: ringtree's algorithms as MSCCL-IR ------------------------------------------

EXPRESSIBLE = [c for c in Collective if c is not Collective.BARRIER]


@pytest.mark.parametrize("coll,algo", [(c, a) for c in EXPRESSIBLE for a in algorithms(c)
                                       if not a.startswith(("collnet", "nvls"))])
def test_export_then_import_computes_the_same_bits(coll, algo):
    """import(export(P)) leaves every output chunk of every rank with the same reduction
    tree as P, on 2..8 ranks and 1..4 channels (the checker's proof, not a text diff)."""
    for n in range(2, 9):
        for channels in (1, 2, 3, 4):
            programs = generate_all(coll, algo, n, Options(channels=channels))
            text = msccl.to_text(from_programs(programs, algo))
            again, findings = msccl.read_text(text, "export.xml")
            assert all(f.level == "executor" and "thread blocks" in f.what for f in findings)
            assert same_outputs(programs, to_programs(again, algo)), (n, channels)


def test_what_cannot_be_exported_says_why():
    with pytest.raises(ExportError, match="in-network switch"):
        from_programs(generate_all(Collective.ALL_REDUCE, "collnet_direct", 4,
                                   Options(nodes=(0, 0, 1, 1))), "c")
    with pytest.raises(ExportError, match="barrier has no MSCCL-IR collective"):
        from_programs(generate_all(Collective.BARRIER, "dissemination", 4), "b")


def test_algo_export_writes_a_file_every_executor_loads(tmp_path, capsys):
    from ringtree.tools.algo import main

    out = tmp_path / "ring.xml"
    assert main(["export", "ring", "all_reduce", "-n", "4", "--channels", "2",
                 "--proto", "LL", "-o", str(out)]) == 0
    algo, findings = msccl.read(str(out), strict=True)
    assert (algo.coll, algo.ngpus, algo.nchannels, algo.proto) == ("allreduce", 4, 2, "LL")
    assert findings == []
    assert main(["import", "--strict", str(out)]) == 0


# ---- the catalog: files as registered algorithms ----------------------------------------


def test_a_file_is_an_algorithm_by_path_or_by_name_in_the_folder(tmp_path, monkeypatch):
    from ringtree.msccl import catalog
    from ringtree.schedules import generate

    f = tmp_path / "Ring2x.xml"
    f.write_text(GOOD)
    progs = generate_all(Collective.ALL_GATHER, f"msccl:{f}", 2)
    assert [p.algo for p in progs] == ["msccl:ring2x"] * 2
    assert generate(Collective.ALL_GATHER, "msccl:ring2x", 2, 1) is progs[1]
    with pytest.raises(ValueError, match="msccl:ring2x is for 2 ranks, not 4"):
        generate(Collective.ALL_GATHER, "msccl:ring2x", 4, 0)
    with pytest.raises(ValueError, match="is an MSCCL-IR all_gather, not all_reduce"):
        generate(Collective.ALL_REDUCE, f"msccl:{f}", 2, 0)
    monkeypatch.delenv("RINGTREE_MSCCL_ALGOS", raising=False)
    monkeypatch.delenv("MSCCL_ALGO_DIR", raising=False)
    with pytest.raises(ValueError, match="neither MSCCL_ALGO_DIR nor RINGTREE_MSCCL_ALGOS "
                                         "names a folder"):
        generate(Collective.ALL_GATHER, "msccl:elsewhere", 2, 0)
    # a folder: selected as the executors select (collective, ranks, mode, size window)
    d = tmp_path / "algos"
    d.mkdir()
    (d / "a_small.xml").write_text(GOOD.replace('maxBytes="0"', 'maxBytes="1024"')
                                   .replace('name="ring2"', 'name="small"'))
    (d / "b_any.xml").write_text(GOOD)
    monkeypatch.setenv("RINGTREE_MSCCL_ALGOS", str(d))
    assert generate(Collective.ALL_GATHER, "msccl:b_any", 2, 0).algo == "msccl:b_any"
    pick = catalog.candidates
    assert [e.name for e in pick(Collective.ALL_GATHER, 2, 512, True)] == \
        ["msccl:a_small", "msccl:b_any"]
    assert [e.name for e in pick(Collective.ALL_GATHER, 2, 4096, True)] == ["msccl:b_any"]
    assert pick(Collective.ALL_GATHER, 2, 4096, False) == []   # in place only
    assert pick(Collective.ALL_GATHER, 4, 4096, True) == []
    assert pick(Collective.ALL_REDUCE, 2, 4096, True) == []


# ---- running files on real ranks ---------------------------------------------------------


def _run_all_reduce(comm, path: str) -> bool:
    import numpy as np

    n = 8 * 3 * 5
    x = (np.arange(n, dtype=np.float32) % 97) + comm.rank
    y = np.empty_like(x)
    comm.all_reduce(x, out=y, algo=f"msccl:{path}")
    want = sum((np.arange(n, dtype=np.float32) % 97) + r for r in range(comm.size))
    return bool(np.array_equal(y, want)) and bool(np.array_equal(x, (np.arange(
        n, dtype=np.float32) % 97) + comm.rank))


def _run_all_gather(comm, path: str) -> bool:
    import numpy as np

    x = np.arange(64, dtype=np.float32) + 1000 * comm.rank
    y = comm.all_gather(x, algo=f"msccl:{path}")
    return bool(np.array_equal(y.reshape(comm.size, 64), np.stack(
        [np.arange(64, dtype=np.float32) + 1000 * r for r in range(comm.size)])))


def test_an_exported_schedule_runs_as_an_msccl_file_on_real_ranks(tmp_path):
    """ringtree's own ring, written as MSCCL-IR and run through the importer on 4 ranks:
    exact sums, the input untouched."""
    from ringtree.testing import run_ranks
    from ringtree.tools.algo import main

    path = tmp_path / "ring4.xml"
    assert main(["export", "ring", "all_reduce", "-n", "4", "--channels", "2",
                 "-o", str(path)]) == 0
    assert run_ranks(_run_all_reduce, 4, str(path)) == [True] * 4


@corpus
def test_a_public_file_runs_on_real_ranks():
    from ringtree.testing import run_ranks

    path = CORPUS / "ag_hier_4_Simple.xml"
    assert run_ranks(_run_all_gather, 4, str(path)) == [True] * 4


def _misuse(comm, in_place_only: str, ring: str) -> list[str]:
    import numpy as np

    errors = []
    for call in (lambda: comm.all_gather(np.arange(4, dtype=np.float32),
                                         algo=f"msccl:{in_place_only}"),
                 lambda: comm.all_reduce(np.ones(7, np.float32), out=np.empty(7, np.float32),
                                         algo=f"msccl:{ring}")):
        try:
            call()
            errors.append("ran")
        except ValueError as e:
            errors.append(str(e))
    return errors


def test_a_call_an_imported_file_cannot_serve_is_refused_before_anything_is_sent(tmp_path):
    """Out of place for a file that runs in place only, and a count its chunks do not
    divide (its executors would not run it either): a ValueError on every rank."""
    from ringtree.testing import run_ranks
    from ringtree.tools.algo import main

    f, ring = tmp_path / "ring2.xml", tmp_path / "ring.xml"
    f.write_text(GOOD)
    assert main(["export", "ring", "all_reduce", "-n", "2", "-o", str(ring)]) == 0
    for errors in run_ranks(_misuse, 2, str(f), str(ring)):
        assert "msccl:ring2 runs in place only" in errors[0]
        assert "msccl:ring cuts each block into 2 equal chunks: 7 elements" in errors[1]
