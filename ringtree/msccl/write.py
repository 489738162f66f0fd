"""Writing MSCCL-IR that every executor's reader accepts: no XML declaration, one element a
line, every attribute of an element on its line with single spaces and double quotes,
two-space indentation (no tabs), the executor's required ``outofplace``, ``minBytes`` and
``maxBytes`` always written, ``s`` counting positions in the block."""

from __future__ import annotations

from ringtree.msccl.model import Algorithm, MStep


def _attrs(pairs: list[tuple[str, object]]) -> str:
    return " ".join(f'{k}="{v}"' for k, v in pairs)


def _step(st: MStep) -> str:
    return "      <step " + _attrs([
        ("s", st.s), ("type", st.type), ("srcbuf", st.srcbuf), ("srcoff", st.srcoff),
        ("dstbuf", st.dstbuf), ("dstoff", st.dstoff), ("cnt", st.cnt), ("depid", st.depid),
        ("deps", st.deps), ("hasdep", st.hasdep)]) + "/>"


def to_text(a: Algorithm) -> str:
    """The file's text (ends with a newline)."""
    outofplace = (not a.inplace) if a.outofplace is None else a.outofplace
    lines = ["<algo " + _attrs([
        ("name", a.name), ("proto", a.proto), ("nchannels", a.nchannels),
        ("nchunksperloop", a.nchunksperloop), ("ngpus", a.ngpus), ("coll", a.coll),
        ("inplace", int(a.inplace)), ("outofplace", int(outofplace)),
        ("minBytes", a.min_bytes or 0), ("maxBytes", a.max_bytes or 0)]) + ">"]
    for g in a.gpus:
        lines.append("  <gpu " + _attrs([("id", g.id), ("i_chunks", g.i_chunks),
                                         ("o_chunks", g.o_chunks),
                                         ("s_chunks", g.s_chunks)]) + ">")
        for tb in g.tbs:
            lines.append("    <tb " + _attrs([("id", tb.id), ("send", tb.send),
                                              ("recv", tb.recv), ("chan", tb.chan)]) + ">")
            lines += [_step(st) for st in tb.steps]
            lines.append("    </tb>")
        lines.append("  </gpu>")
    lines.append("</algo>")
    return "\n".join(lines) + "\n"
