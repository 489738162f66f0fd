"""MSCCL-IR: the algorithm files of MSCCL's executors (NCCL's MSCCL executor, RCCL), read,
checked and written.

>>> from ringtree import msccl
>>> algo, findings = msccl.read("allreduce.xml")             # doctest: +SKIP
>>> text = msccl.to_text(algo)                                # doctest: +SKIP

:func:`read` parses a file the way the executors' loader does and reports, as
:class:`Finding` s naming file, line, GPU, thread block and step, both what makes the
algorithm wrong (level ``error``: an unknown step type, a chunk outside its buffer, a
dependency on a step that never publishes) and what an executor would refuse although
ringtree can read it (level ``executor``: an XML declaration, a tab, a missing
``outofplace``/``minBytes``/``maxBytes``, the first runtime's ``reduce_scatter`` name,
its limits); ``strict=True`` raises on either. :func:`to_text` writes a file every
executor's reader accepts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ringtree.ir.check import CheckError, CheckReport, check_programs
from ringtree.ir.program import Program
from ringtree.msccl.model import COLLECTIVES, Algorithm, Gpu, MStep, ThreadBlock, from_tree
from ringtree.msccl.program import MscclImportError, to_programs
from ringtree.msccl.write import to_text
from ringtree.msccl.xml import Finding, MscclSyntaxError, parse

__all__ = ["COLLECTIVES", "Algorithm", "Finding", "Gpu", "Imported", "MStep", "MscclError",
           "MscclSyntaxError", "ThreadBlock", "load", "read", "read_text", "to_text"]


class MscclError(ValueError):
    """An MSCCL-IR file that cannot be used: the message lists every finding."""

    def __init__(self, path: str, findings: list[Finding]) -> None:
        self.findings = findings
        super().__init__(f"{path}: {len(findings)} problem(s):\n" +
                         "\n".join(f"  {f.level}: {f}" for f in findings))


def read_text(text: str, path: str = "<text>", strict: bool = False
              ) -> tuple[Algorithm, list[Finding]]:
    """The algorithm in ``text`` and what an executor would refuse in it. Raises
    :class:`MscclError` when it is wrong (or, with ``strict``, when any executor would
    refuse it) and :class:`MscclSyntaxError` when it is not MSCCL-IR at all."""
    root, findings = parse(text, path)
    algo, more = from_tree(root, path)
    findings += more
    bad = [f for f in findings if f.level == "error" or strict]
    if algo is None or bad:
        raise MscclError(path, bad or findings)
    return algo, findings


def read(path: str, strict: bool = False) -> tuple[Algorithm, list[Finding]]:
    """:func:`read_text` of the file at ``path``."""
    with open(path, encoding="utf-8") as f:
        return read_text(f.read(), path, strict)


@dataclass
class Imported:
    """A file read, turned into one Program per GPU and proven by ringtree's checker in
    the modes it declares (in place, out of place)."""

    path: str
    algo: Algorithm
    findings: list[Finding]
    programs: list[Program]
    reports: list[CheckReport]


def load(path: str, name: str | None = None, strict: bool = False) -> Imported:
    """Read ``path``, build its Programs (named ``name``, default ``msccl:<file stem>``)
    and prove them: the collective's result on every rank, the same bits on every rank,
    no cyclic wait, no read of unwritten memory. Raises :class:`MscclError` naming the
    file and what fails."""
    algo, findings = read(path, strict)
    name = name or "msccl:" + os.path.splitext(os.path.basename(path))[0]
    try:
        programs = to_programs(algo, name)
    except MscclImportError as e:
        raise MscclError(path, [Finding("error", path, str(e))]) from None
    modes = [m for m, ok in ((False, algo.outofplace or algo.outofplace is None and
                              not algo.inplace), (True, algo.inplace)) if ok]
    reports = []
    for in_place in modes:
        try:
            reports.append(check_programs(programs, in_place=in_place))
        except CheckError as e:
            mode = "in place" if in_place else "out of place"
            raise MscclError(path, [Finding("error", path, f"run {mode}: {_step_of(e, algo, programs)}"
                                            )]) from None
    return Imported(path, algo, findings, programs, reports)


def _step_of(e: CheckError, algo: Algorithm, programs: list[Program]) -> str:
    """The checker's message, with the MSCCL step at fault named (gpu, block, step)."""
    if e.where is None:
        return str(e)
    r, c, i = e.where
    tb, s = programs[r].meta["msccl_steps"][c][i]
    return f"gpu {r} tb {tb} step {s} ({algo.gpus[r].tbs[tb].steps[s].type}): {e}"
