"""MSCCL-IR files: read as the executors read them, checked, written back.

The public corpus (27 files from Azure/msccl-scheduler, Azure/msccl-executor-nccl,
ROCm/rccl and microsoft/TE-CCL, described in the project's reference material) is read
from ``RINGTREE_MSCCL_CORPUS`` or ``../shared/reference/msccl-xml`` beside the checkout;
those tests skip, saying so, where it is absent. The hand-made files below each break one
rule."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ringtree import msccl
from ringtree.ir.collectives import Collective

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
