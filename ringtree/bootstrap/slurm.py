"""Slurm's compressed lists: host lists (``SLURM_NODELIST``) and tasks per node.

``node[01-03,07],gpu3`` is Slurm's notation for six hosts (``scontrol show hostnames``
expands it); ``SLURM_TASKS_PER_NODE`` is ``4(x2),3`` for 4, 4 and 3 tasks. Read by
:mod:`ringtree.bootstrap.job` to find the master host and the local world size.
"""

from __future__ import annotations

import re

__all__ = ["expand_nodelist", "parse_tasks_per_node"]


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand Slurm's compressed host list: ``"node[01-03,07],gpu3"`` → ``node01 … gpu3``.

    Zero padding is kept, several bracket groups in one name expand as a product
    (``"r[1-2]n[1-2]"`` → ``r1n1 r1n2 r2n1 r2n2``).
    """
    hosts: list[str] = []
    for item in _split_top_level(nodelist):
        hosts.extend(_expand_host(item, nodelist))
    return hosts


def parse_tasks_per_node(spec: str) -> list[int]:
    """Expand ``SLURM_TASKS_PER_NODE``: ``"4(x2),3"`` → ``[4, 4, 3]`` (one entry per node)."""
    counts: list[int] = []
    for item in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if m is None:
            raise ValueError(f"cannot parse tasks-per-node entry {item!r} in {spec!r}")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


def _split_top_level(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in host list {text!r}")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"unbalanced '[' in host list {text!r}")
    items.append(text[start:])
    return [s.strip() for s in items if s.strip()]


def _expand_host(pattern: str, whole: str) -> list[str]:
    m = re.search(r"\[([^\[\]]*)\]", pattern)
    if m is None:
        return [pattern]
    head, tail = pattern[: m.start()], pattern[m.end() :]
    out: list[str] = []
    for part in m.group(1).split(","):
        part = part.strip()
        r = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if r is None:
            raise ValueError(f"cannot parse range {part!r} in host list {whole!r}")
        lo_s, hi_s = r.group(1), r.group(2) or r.group(1)
        lo, hi, width = int(lo_s), int(hi_s), len(lo_s)
        if hi < lo:
            raise ValueError(f"descending range {part!r} in host list {whole!r}")
        for n in range(lo, hi + 1):
            for rest in _expand_host(tail, whole):
                out.append(f"{head}{n:0{width}d}{rest}")
    return out
