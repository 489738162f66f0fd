"""MSCCL-IR files as registered algorithms: ``msccl:PATH`` or ``msccl:NAME``.

``msccl:PATH`` names a file; ``msccl:NAME`` a file ``NAME.xml`` in the folder
``RINGTREE_MSCCL_ALGOS`` names. The first time a name is asked for (the registry's
:func:`~ringtree.schedules.registry.record` calls :func:`resolve`), the file is read,
imported and proven (:func:`ringtree.msccl.load`), then registered like any algorithm
under ``msccl:<file stem>`` for its collective: its generator returns the imported
Program of a rank, for the file's GPU count only, and every reader (the planner, the
tuner's statistics, the simulator, ``ringtree algo show``) takes it from the registry.

:func:`candidates` lists a folder's files the way the executors select them: by
collective, rank count, in-place mode and the ``[minBytes, maxBytes]`` window (0 as
``maxBytes``: no limit), in sorted file order, which is their priority.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ringtree.ir.collectives import Collective
from ringtree.ir.program import Program
from ringtree.settings import current

PREFIX = "msccl:"


@dataclass(frozen=True)
class Entry:
    """One registered file."""

    name: str           # msccl:<stem>
    path: str
    collective: Collective
    ngpus: int
    inplace: bool
    outofplace: bool
    min_bytes: int
    max_bytes: int      # 0: no limit
    chunks: int         # nchunksperloop: the call's count must be a multiple of it


_ENTRIES: dict[str, Entry] = {}
_NAMES: dict[str, str] = {}  # as the caller spelled it -> registered name


def folder() -> str | None:
    return current().msccl_algos


def _path_of(spec: str) -> str:
    """The file ``msccl:SPEC`` names: a path, or ``SPEC.xml`` in the folder."""
    ref = spec[len(PREFIX):]
    if os.sep in ref or ref.endswith(".xml") or os.path.exists(ref):
        return ref
    base = folder()
    if base is None:
        raise ValueError(f"{spec}: not a file, and RINGTREE_MSCCL_ALGOS names no folder "
                         "to look for it in")
    path = os.path.join(base, ref + ".xml")
    if not os.path.exists(path):
        raise ValueError(f"{spec}: no {ref}.xml in RINGTREE_MSCCL_ALGOS={base}")
    return path


def resolve(spec: str) -> Entry:
    """Read, import, prove and register the file ``spec`` names (once per name)."""
    from ringtree import msccl
    from ringtree.schedules.registry import register

    path = _path_of(spec)
    name = PREFIX + os.path.splitext(os.path.basename(path))[0].lower()
    known = _ENTRIES.get(name)
    if known is not None:
        if os.path.realpath(known.path) != os.path.realpath(path):
            raise ValueError(f"{spec}: {name} is already {known.path}")
        return known
    imp = msccl.load(path, name)
    a = imp.algo
    programs = tuple(imp.programs)

    def generate(nranks: int, rank: int, opts) -> Program:
        if nranks != a.ngpus:
            raise ValueError(f"{name} is for {a.ngpus} ranks, not {nranks}")
        if a.collective.spec.rooted and opts.root != programs[0].root:
            raise ValueError(f"{name} is for root {programs[0].root} (MSCCL-IR names none), "
                             f"not {opts.root}")
        return programs[rank]

    register(a.collective, name, cost=f"MSCCL-IR {os.path.basename(path)}")(generate)
    entry = _ENTRIES[name] = Entry(
        name, path, a.collective, a.ngpus, a.inplace,
        a.outofplace if a.outofplace is not None else not a.inplace,
        a.min_bytes or 0, a.max_bytes or 0, a.nchunksperloop)
    return entry


def name_of(spec: str) -> str:
    """The registered name of ``msccl:PATH`` or ``msccl:NAME`` (resolved once)."""
    name = _NAMES.get(spec)
    if name is None:
        name = _NAMES[spec] = resolve(spec).name
    return name


def forget() -> None:
    """Unregister every file registered so far (they are read again when next named)."""
    from ringtree.schedules.registry import unregister

    for e in _ENTRIES.values():
        unregister(e.collective, e.name)
    _ENTRIES.clear()
    _NAMES.clear()


def candidates(coll: Collective, nranks: int, nbytes: int, in_place: bool) -> list[Entry]:
    """The folder's files an executor would select for this call, in priority order
    (each read and proven the first time; a file that fails is an error naming it)."""
    base = folder()
    if base is None:
        return []
    out = []
    for f in sorted(os.listdir(base)):
        if not f.endswith(".xml"):
            continue
        e = resolve(PREFIX + os.path.join(base, f))
        if e.collective is coll and e.ngpus == nranks and \
                (e.inplace if in_place else e.outofplace) and e.min_bytes <= nbytes and \
                (e.max_bytes == 0 or nbytes <= e.max_bytes):
            out.append(e)
    return out
