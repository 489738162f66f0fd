"""MSCCL-IR files in the planner: which file serves a call, what a file asks of a call,
and when a file written for LL runs on LL.

As MSCCL's executors do (``mscclInternalSchedulerSelectAlgo``), a call that names no
algorithm first looks through the folders of files (``MSCCL_ALGO_DIR``, then
``RINGTREE_MSCCL_ALGOS``; :func:`ringtree.msccl.catalog.candidates`): the first file
for its collective, rank count, in-place mode and size window whose chunks divide the
count serves it; otherwise ringtree's own algorithms do. The executors give no file to
AVG or a user-defined operator, nor does ringtree (nor to PREMUL_SUM or uneven blocks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ringtree.ir.program import Program
from ringtree.ops import ReduceOp
from ringtree.schedules import build
from ringtree.tuning.proto import LL

if TYPE_CHECKING:
    from ringtree.runtime.planner import CallSpec, Planner
    from ringtree.runtime.protocols.ll_rounds import RoundsOp

PREFIX = "msccl:"   # the names of imported files
_NO_FILE_OPS = (None, ReduceOp.AVG, ReduceOp.PREMUL_SUM)  # None: a user operator


def rules(prog: Program, in_place: bool, count: int) -> None:
    """What an imported MSCCL-IR algorithm asks of a call, as its executors run it only
    then: chunks that divide every block, and the in-place mode its file declares."""
    if prog.meta.get("equal_chunks") and count % prog.chunks:
        raise ValueError(f"{prog.algo} cuts each block into {prog.chunks} equal chunks: "
                         f"{count} elements per block is not a multiple of {prog.chunks}")
    if prog.meta.get("in_place_only") and not in_place:
        raise ValueError(f"{prog.algo} runs in place only (its file says inplace=\"1\" "
                         "outofplace=\"0\"): pass the buffer as its own output")


def from_folders(spec: CallSpec, nranks: int, nbytes: int) -> str | None:
    """The registered name of the first file of the folders an executor would select
    for ``spec`` (``nbytes``: the whole buffer, as the executors count it), or None."""
    coll = spec.coll
    assert coll is not None
    if spec.blocks is not None or coll.reduces and spec.op in _NO_FILE_OPS:
        return None
    from ringtree.msccl.catalog import candidates

    found = candidates(coll, nranks, nbytes, spec.in_place, spec.dtype.itemsize,
                       max(spec.root, 0), first=True)
    return found[0].name if found else None


def rounds_op(planner: Planner, spec: CallSpec, prog: Program, nbytes: int
              ) -> RoundsOp | None:
    """The LL op of an imported file written for LL (``proto="LL"``), run as rounds
    (:mod:`ringtree.runtime.protocols.ll_rounds`); None where LL cannot run the call (no
    LL segment: ranks on several hosts or no shared memory; LL turned off for the
    collective by ``RINGTREE_PROTO``; AVG, PREMUL_SUM or a user operator; in place for a
    Program that needs input and output apart; a round larger than a cell): it then runs
    on Simple, with the same bits."""
    from ringtree.runtime.protocols.ll_rounds import RoundsOp, fits

    coll, ll = spec.coll, planner.ll
    assert coll is not None
    enabled = planner.proto_enabled.get(coll)
    if ll is None or prog.meta.get("proto") != "LL" or \
            (enabled is not None and LL not in enabled) or \
            (coll.reduces and spec.op in _NO_FILE_OPS) or \
            (spec.in_place and not prog.in_place_ok):
        return None
    base = planner._base(spec.root)
    programs = [build(coll, prog.algo, planner.size, r, nbytes, base)
                for r in range(planner.size)]
    if fits(programs, spec.in_place, spec.count, spec.dtype.storage.itemsize,
            ll.ll.cell_bytes) is not None:
        return None
    code = spec.reducer.code if spec.reducer is not None else 0
    return RoundsOp(ll.ll, programs, spec.dtype, spec.count, code, spec.root, spec.in_place)
