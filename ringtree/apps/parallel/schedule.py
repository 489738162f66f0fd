"""Pipeline schedules as explicit tables, and their bubble.

A schedule is, per stage, the list of actions it runs in order: ``("F", j)`` forward of
micro-batch ``j``, ``("B", j)`` its backward. The executor
(:mod:`ringtree.apps.parallel.pipeline_parallel`) runs exactly this list; :func:`timeline`
places the actions on a clock (stage s may run F j once stage s-1 has, B j once stage
s+1 has, one action at a time per stage) and :func:`render` prints it the way
``ringtree algo show`` prints a collective.

- GPipe (Huang et al., NeurIPS 2019): all m forwards, then all m backwards.
- 1F1B / PipeDream-Flush (Narayanan et al., ICML 2021; Megatron-LM, SC 2021): stage s
  runs ``min(p - s - 1, m)`` warm-up forwards, then alternates one forward and one
  backward, then drains the remaining backwards. At most p micro-batches in flight.

Both have the same bubble: with p stages and m micro-batches each stage idles for
``(p - 1)`` slots of ``(m + p - 1)``, the fraction :func:`bubble_fraction`
``(p - 1) / (m + p - 1)``; Megatron writes the same as bubble/ideal = ``(p - 1) / m``.
"""

from __future__ import annotations

Action = tuple[str, int]


def gpipe(p: int, m: int) -> list[list[Action]]:
    """All forwards, then all backwards (in micro-batch order), on every stage."""
    return [[("F", j) for j in range(m)] + [("B", j) for j in range(m)] for _ in range(p)]


def one_f_one_b(p: int, m: int) -> list[list[Action]]:
    """PipeDream-Flush: warm-up forwards, steady one-forward-one-backward, cool-down."""
    table = []
    for s in range(p):
        warm = min(p - s - 1, m)
        acts: list[Action] = [("F", j) for j in range(warm)]
        f, b = warm, 0
        while f < m:
            acts += [("F", f), ("B", b)]
            f, b = f + 1, b + 1
        acts += [("B", j) for j in range(b, m)]
        table.append(acts)
    return table


SCHEDULES = {"1f1b": one_f_one_b, "gpipe": gpipe}


def make(name: str, p: int, m: int) -> list[list[Action]]:
    """The table of schedule ``name`` (``1f1b`` or ``gpipe``)."""
    if name not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {name!r} (choose from {', '.join(SCHEDULES)})")
    if p < 1 or m < 1:
        raise ValueError(f"a pipeline needs p >= 1 stages and m >= 1 micro-batches, got {p}, {m}")
    return SCHEDULES[name](p, m)


def bubble_fraction(p: int, m: int) -> float:
    """Idle share of a stage's step, ``(p - 1) / (m + p - 1)``."""
    return (p - 1) / (m + p - 1)


def timeline(table: list[list[Action]], f_cost: float = 1.0,
             b_cost: float = 2.0) -> list[list[tuple[float, float, Action]]]:
    """Start and end time of every action under unit costs (B ≈ 2 F, as in GPipe).

    Raises ValueError if the table deadlocks (an action waits for one never run).
    """
    p = len(table)
    done: dict[tuple[int, str, int], float] = {}
    pos, clock = [0] * p, [0.0] * p
    out: list[list[tuple[float, float, Action]]] = [[] for _ in range(p)]
    remaining = sum(len(t) for t in table)
    while remaining:
        progressed = False
        for s in range(p):
            if pos[s] == len(table[s]):
                continue
            kind, j = table[s][pos[s]]
            deps = [(s - 1, "F", j)] if kind == "F" and s > 0 else []
            if kind == "B":
                deps = [(s, "F", j)] + ([(s + 1, "B", j)] if s < p - 1 else [])
            if any(d not in done for d in deps):
                continue
            start = max([clock[s]] + [done[d] for d in deps])
            end = start + (f_cost if kind == "F" else b_cost)
            done[(s, kind, j)] = clock[s] = end
            out[s].append((start, end, (kind, j)))
            pos[s] += 1
            remaining -= 1
            progressed = True
        if not progressed:
            stuck = {s: table[s][pos[s]] for s in range(p) if pos[s] < len(table[s])}
            raise ValueError(f"schedule deadlocks; stages wait at {stuck}")
    return out


def idle_fraction(tl: list[list[tuple[float, float, Action]]]) -> float:
    """Mean idle share of the stages over the makespan of a :func:`timeline`."""
    span = max(e for row in tl for _, e, _ in row)
    busy = [sum(e - s for s, e, _ in row) for row in tl]
    return 1 - sum(busy) / (len(tl) * span)


def render(table: list[list[Action]], f_cost: int = 1, b_cost: int = 2) -> str:
    """A text chart, one row per stage, one column per time unit (``F3`` / ``b3`` / ``.``)."""
    tl = timeline(table, f_cost, b_cost)
    span = int(max(e for row in tl for _, e, _ in row))
    width = max(2, len(str(max(j for row in table for _, j in row))) + 1)
    lines = []
    for s, row in enumerate(tl):
        cells = ["." * width] * span
        for start, end, (kind, j) in row:
            for t in range(int(start), int(end)):
                cells[t] = f"{kind if t == int(start) else kind.lower()}{j}".ljust(width)
        lines.append(f"stage {s}: " + " ".join(cells))
    p, m = len(table), 1 + max(j for _, j in table[0])
    lines.append(f"bubble: {idle_fraction(tl):.3f} of each stage's time "
                 f"(formula (p-1)/(m+p-1) = {p - 1}/{m + p - 1} = {bubble_fraction(p, m):.3f})")
    return "\n".join(lines)
