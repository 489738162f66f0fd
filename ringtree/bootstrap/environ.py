"""The process environment: the one place besides ``settings.py`` that reads or changes it.

Tuning knobs (``RINGTREE_*``) are read only by :mod:`ringtree.settings`. What is left is
what launchers exist to pass: the job's identity (rank, world size, master address, token;
:mod:`ringtree.bootstrap.job`, :mod:`ringtree.bootstrap.jobtoken`), the environment a
launcher hands the processes it starts (``ringtree run``, its ssh hops, ``ringtree perf
--nranks``, ``ringtree testbed``), and the variables a tool or test sets for ranks it runs
in this process. All of it goes through these functions, so one ``grep`` finds every
reader, and setting a variable for a while and restoring it is written once.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

__all__ = ["child", "export", "exported", "get", "view"]


def view() -> Mapping[str, str]:
    """The environment as this process has it now (live, read-only by convention)."""
    return os.environ


def get(name: str, default: str | None = None) -> str | None:
    """One variable (``default`` when unset)."""
    return os.environ.get(name, default)


def child(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a process this one starts: a copy, with ``extra`` on top."""
    env = dict(os.environ)
    if extra:
        env.update(extra)
    return env


def export(values: Mapping[str, object | None]) -> None:
    """Set variables in this process (None: unset), for what it starts or runs next."""
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = str(v)


@contextmanager
def exported(values: Mapping[str, object | None]) -> Iterator[None]:
    """:func:`export` ``values`` for the block, then put back what was there."""
    old = {k: os.environ.get(k) for k in values}
    export(values)
    try:
        yield
    finally:
        export(old)
