"""MSCCL-IR files as registered algorithms: ``msccl:PATH`` or ``msccl:NAME``.

``msccl:PATH`` names a file; ``msccl:NAME`` a file ``NAME.xml`` in the folders
:func:`folders` lists: ``MSCCL_ALGO_DIR`` (the executors' variable), then
``RINGTREE_MSCCL_ALGOS``. The first time a name is asked for (the registry's
:func:`~ringtree.schedules.registry.record` calls :func:`resolve`), the file is read,
imported and proven (:func:`ringtree.msccl.load`), then registered like any algorithm
under ``msccl:<file stem>`` for its collective: its generator returns the imported
Program of a rank, for the file's GPU count only, and every reader (the planner, the
tuner's statistics, the simulator, ``ringtree algo show``) takes it from the registry.

:func:`candidates` lists the folders' files the way the executors select them: by
collective, rank count, in-place mode, the ``[minBytes, maxBytes]`` window (0 as
``maxBytes``: no limit) and a count the file's chunks divide, folder by folder in sorted
file order, which is their priority. It reads only each file's ``<algo>`` tag until a
file fits the call; only that file is imported and proven. A file that fails the proof is
never run: :func:`candidates` warns once, naming it and why, and passes over it (the
planner then uses the next file, or ringtree's own algorithms).
"""

from __future__ import annotations

import os
import re
import warnings
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
    root: int = 0       # rooted collectives: the root its steps imply


_ENTRIES: dict[str, Entry] = {}
_NAMES: dict[str, str] = {}  # as the caller spelled it -> registered name


def folders() -> list[tuple[str, str]]:
    """(variable, folder) of every folder of MSCCL-IR files, in priority order:
    ``MSCCL_ALGO_DIR`` (as NCCL's MSCCL executor reads it), then ``RINGTREE_MSCCL_ALGOS``.
    A variable naming no folder is an error naming it."""
    out = []
    for var, base in (("MSCCL_ALGO_DIR", os.environ.get("MSCCL_ALGO_DIR", "").strip()),
                      ("RINGTREE_MSCCL_ALGOS", current().msccl_algos)):
        if not base:
            continue
        if not os.path.isdir(base):
            raise ValueError(f"{var}={base}: not a folder")
        out.append((var, base))
    return out


def _path_of(spec: str) -> str:
    """The file ``msccl:SPEC`` names: a path, or ``SPEC.xml`` in the first folder that
    has it."""
    ref = spec[len(PREFIX):]
    if os.sep in ref or ref.endswith(".xml") or os.path.exists(ref):
        return ref
    bases = folders()
    if not bases:
        raise ValueError(f"{spec}: not a file, and neither MSCCL_ALGO_DIR nor "
                         "RINGTREE_MSCCL_ALGOS names a folder to look for it in")
    for _, base in bases:
        path = os.path.join(base, ref + ".xml")
        if os.path.exists(path):
            return path
    raise ValueError(f"{spec}: no {ref}.xml in " +
                     ", ".join(f"{var}={base}" for var, base in bases))


def resolve(spec: str) -> Entry:
    """Read, import, prove and register the file ``spec`` names (once per name)."""
    from ringtree import msccl

    path = _path_of(spec)
    name = PREFIX + os.path.splitext(os.path.basename(path))[0].lower()
    known = _ENTRIES.get(name)
    if known is not None:
        if os.path.realpath(known.path) != os.path.realpath(path):
            raise ValueError(f"{spec}: {name} is already {known.path}")
        return known
    return add(msccl.load(path, name))


def add(imp) -> Entry:
    """Register an imported file (:class:`ringtree.msccl.Imported`, named
    ``msccl:<stem>``) as an algorithm."""
    from ringtree.schedules.registry import register

    a, path, name = imp.algo, imp.path, imp.programs[0].algo
    programs = tuple(imp.programs)

    def generate(nranks: int, rank: int, opts) -> Program:
        if nranks != a.ngpus:
            raise ValueError(f"{name} is for {a.ngpus} ranks, not {nranks}")
        if a.collective.spec.rooted and opts.root != programs[0].root:
            raise ValueError(f"{name} is for root {programs[0].root} (MSCCL-IR names none), "
                             f"not {opts.root}")
        return programs[rank]

    # tuned=False: a file runs where it is named or where a folder's rules choose it
    # (:func:`candidates`), never as one of the tuner's own candidates.
    register(a.collective, name, cost=f"MSCCL-IR {os.path.basename(path)}",
             tuned=False)(generate)
    entry = _ENTRIES[name] = Entry(
        name, path, a.collective, a.ngpus, a.inplace,
        a.outofplace if a.outofplace is not None else not a.inplace,
        a.min_bytes or 0, a.max_bytes or 0, a.nchunksperloop, programs[0].root)
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
    _REFUSED.clear()


@dataclass(frozen=True)
class Head:
    """What the executors select a file by: its ``<algo>`` tag's attributes."""

    coll: str
    ngpus: int
    inplace: bool
    outofplace: bool
    min_bytes: int
    max_bytes: int
    chunks: int


_HEADS: dict[tuple[str, float], Head | None] = {}
_REFUSED: dict[str, str] = {}   # path -> why it is never run
_ATTR = re.compile(r'([A-Za-z_]+)="([^"]*)"')


def head(path: str) -> Head | None:
    """The file's ``<algo>`` attributes, read from its first tag only (None: not
    MSCCL-IR; :func:`resolve` then says why if the file is asked for)."""
    key = (path, os.path.getmtime(path))
    if key not in _HEADS:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(4096)
        m = re.search(r"<algo\s([^>]*)>", text)
        a = dict(_ATTR.findall(m.group(1))) if m else {}
        try:
            inplace = a.get("inplace") == "1"
            _HEADS[key] = Head(a["coll"], int(a["ngpus"]), inplace,
                               a.get("outofplace", "0" if inplace else "1") == "1",
                               int(a.get("minBytes", 0)), int(a.get("maxBytes", 0)),
                               int(a["nchunksperloop"]))
        except (KeyError, ValueError):
            _HEADS[key] = None
    return _HEADS[key]


def _fits(h: Head, coll: Collective, nranks: int, nbytes: int, elems: int,
          in_place: bool) -> bool:
    from ringtree.msccl.model import COLLECTIVES

    return COLLECTIVES.get(h.coll) is coll and h.ngpus == nranks and \
        (h.inplace if in_place else h.outofplace) and h.min_bytes <= nbytes and \
        (h.max_bytes == 0 or nbytes <= h.max_bytes) and elems > 0 and \
        elems % h.chunks == 0


def candidates(coll: Collective, nranks: int, nbytes: int, in_place: bool,
               itemsize: int = 1, root: int = 0, first: bool = False) -> list[Entry]:
    """The folders' files an executor would select for a call of ``nbytes`` (the whole
    buffer, as the executors count it: all-gather's output, reduce-scatter's input), in
    priority order: collective, rank count, in-place mode, size window, chunks that
    divide the call's ``nbytes / itemsize`` elements (and for rooted collectives the
    root; MSCCL-IR names none, its steps imply one). ``first``: stop at the first.
    Each file that fits is imported and proven the first time; one that fails is
    passed over, with a warning naming it, once."""
    from ringtree import msccl

    out = []
    for _, base in folders():
        for f in sorted(os.listdir(base)):
            path = os.path.join(base, f)
            if not f.endswith(".xml") or not os.path.isfile(path) or path in _REFUSED:
                continue
            h = head(path)
            if h is None:
                _REFUSED[path] = "no <algo> tag with coll, ngpus and nchunksperloop"
                warnings.warn(f"ringtree: not using {path}: {_REFUSED[path]}", stacklevel=2)
                continue
            if not _fits(h, coll, nranks, nbytes, nbytes // itemsize, in_place):
                continue
            try:
                e = resolve(PREFIX + path)
            except (msccl.MscclError, msccl.MscclSyntaxError, ValueError) as err:
                _REFUSED[path] = str(err)
                warnings.warn(f"ringtree: not using MSCCL-IR file {err}", stacklevel=2)
                continue
            if coll.spec.rooted and e.root != root:
                continue
            out.append(e)
            if first:
                return out
    return out
