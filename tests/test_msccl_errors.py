"""Hand-made MSCCL-IR files that break one rule each, with the error each gets: a
receive with no send, a dependency cycle, a reduction that double counts, a chunk
index out of range, a missing attribute, a tab in a tag. (test_msccl.py has more single
rules: an unknown step type, a block without the peer its step needs, an XML
declaration, a tab between elements, reductions in different orders ...)"""

from __future__ import annotations

import pytest

from ringtree import msccl

STEP = ('      <step s="{s}" type="{t}" srcbuf="{sb}" srcoff="{so}" dstbuf="{db}" dstoff="0" '
        'cnt="1" depid="{d}" deps="{k}" hasdep="{h}"/>')
NONE = (-1, -1, 0)


def two_gpus(gpu0: list, gpu1: list) -> str:
    """An out-of-place all-reduce on 2 GPUs of one chunk: per GPU, its blocks as
    (send peer, recv peer, [(type, srcbuf, dstbuf, depid, deps, hasdep), ...])."""
    lines = ['<algo name="t" proto="Simple" nchannels="1" nchunksperloop="1" ngpus="2" '
             'coll="allreduce" inplace="0" outofplace="1" minBytes="0" maxBytes="0">']
    for g, blocks in enumerate((gpu0, gpu1)):
        lines.append(f'  <gpu id="{g}" i_chunks="1" o_chunks="1" s_chunks="0">')
        for tb, (send, recv, steps) in enumerate(blocks):
            lines.append(f'    <tb id="{tb}" send="{send}" recv="{recv}" chan="0">')
            for s, (t, sb, db, d, k, h) in enumerate(steps):
                lines.append(STEP.format(s=s, t=t, sb=sb, so=0, db=db, d=d, k=k, h=h))
            lines.append("    </tb>")
        lines.append("  </gpu>")
    return "\n".join(lines + ["</algo>", ""])


def correct() -> str:
    """GPU 0 adds GPU 1's input to its own and sends the sum back."""
    return two_gpus([(1, 1, [("rrc", "i", "o", *NONE), ("s", "o", "o", *NONE)])],
                    [(0, 0, [("s", "i", "i", *NONE), ("r", "o", "o", *NONE)])])


def double_counting() -> str:
    """GPU 0 adds GPU 1's input twice."""
    return two_gpus([(1, 1, [("rrc", "i", "o", *NONE), ("rrc", "o", "o", *NONE),
                             ("s", "o", "o", *NONE)])],
                    [(0, 0, [("s", "i", "i", *NONE), ("s", "i", "i", *NONE),
                             ("r", "o", "o", *NONE)])])


def _load(tmp_path, text: str) -> str:
    f = tmp_path / "t.xml"
    f.write_text(text)
    with pytest.raises(msccl.MscclError) as e:
        msccl.load(str(f))
    return str(e.value)


def test_the_correct_file_is_proven(tmp_path):
    f = tmp_path / "t.xml"
    f.write_text(correct())
    msccl.read(str(f), strict=True)
    assert msccl.load(str(f)).reports


def test_a_receive_with_no_send(tmp_path):
    text = two_gpus([(1, 1, [("rrc", "i", "o", *NONE), ("s", "o", "o", *NONE)])],
                    [(0, 0, [("r", "o", "o", *NONE)])])
    assert "gpu 0 tb 0 step 0 (rrc) receives from GPU 1 on channel 0, which sends it " \
           "nothing more: a receive with no send" in _load(tmp_path, text)


def test_a_dependency_cycle(tmp_path):
    text = two_gpus([(1, -1, [("s", "i", "i", 1, 0, 1)]),
                     (-1, 1, [("rrc", "i", "o", 0, 0, 1)])],
                    [(0, 0, [("s", "i", "i", *NONE), ("r", "o", "o", *NONE)])])
    assert "a dependency cycle: gpu 0 tb 0 step 0 (s) waits for tb 1 step 0; gpu 0 tb 1 " \
           "step 0 (rrc) waits for tb 0 step 0" in _load(tmp_path, text)


def test_a_reduction_that_double_counts(tmp_path):
    assert "gpu 0 tb 0 step 1 (rrc): rank 0 channel 0 step 1" in \
        _load(tmp_path, double_counting())
    assert "double counting: contributions [(1, 0)] reduced twice" in \
        _load(tmp_path, double_counting())


def test_a_chunk_index_out_of_range(tmp_path):
    text = correct().replace('type="s" srcbuf="i" srcoff="0"', 'type="s" srcbuf="i" srcoff="1"')
    assert "(gpu 1 tb 0 step 0): src chunks 1..1 of buffer 'i', which has 1" in \
        _load_read(text)


def test_a_missing_attribute(tmp_path):
    text = correct().replace(' hasdep="0"/>\n    </tb>\n  </gpu>\n</algo>',
                             '/>\n    </tb>\n  </gpu>\n</algo>')
    assert "(gpu 1 tb 0 step 1): <step> has no attribute 'hasdep'" in _load_read(text)


def test_a_tab_in_a_tag_is_what_an_executor_refuses():
    text = correct().replace('<tb id="0" send="0"', '<tb id="0"\tsend="0"')
    algo, findings = msccl.read_text(text, "t.xml")       # ringtree reads it ...
    assert [str(f) for f in findings] == [
        "t.xml:9: <tb>: a tab before attribute 'send' (the executors' reader separates "
        "attributes by single spaces)"]
    with pytest.raises(msccl.MscclError, match="a tab before attribute 'send'"):
        msccl.read_text(text, "t.xml", strict=True)       # ... and strict refuses it


def _load_read(text: str) -> str:
    with pytest.raises(msccl.MscclError) as e:
        msccl.read_text(text, "t.xml")
    return str(e.value)
