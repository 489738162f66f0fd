"""``ringtree perf plot A.json B.json -o out.png``: busbw and time against size.

Reads ``-J`` files (ringtree perf's or nccl-tests' own) and draws two log-log panels, bus
bandwidth and time per operation against message size, one line per run and
(type, op, root) series; out-of-place solid, in-place dashed. matplotlib is optional
(``pip install matplotlib`` or ``pip install 'ringtree[plot]'``).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

from ringtree.perf.format import load_json
from ringtree.tools import figure


@dataclass
class Series:
    label: str
    sizes: list[int]
    busbw: tuple[list[float], list[float]]  # out-of-place, in-place
    time: tuple[list[float], list[float]]


def _run_label(doc: dict, fallback: str) -> str:
    cfg = doc.get("config") or {}
    backend = cfg.get("backend")
    coll = cfg.get("collective")
    if backend or coll:
        return " ".join(str(x) for x in (backend, coll) if x)
    return fallback


def series_of(doc: dict, label: str | None = None) -> list[Series]:
    """One :class:`Series` per (type, redop, root) in a document's results."""
    base = label or _run_label(doc, "run")
    groups: dict[tuple, Series] = {}
    cycles: dict[tuple, int] = {}
    for row in doc.get("results") or []:
        key = (row.get("type"), row.get("redop"), str(row.get("root", "")).strip())
        size = int(row.get("size", 0))
        s = groups.get((*key, cycles.get(key, 1)))
        if s is not None and s.sizes and size <= s.sizes[-1]:  # -N: the sweep restarted
            cycles[key] = cycles.get(key, 1) + 1
            s = None
        if s is None:
            s = groups[(*key, cycles.get(key, 1))] = Series("", [], ([], []), ([], []))
        s.sizes.append(size)
        for i, half in enumerate(("out_of_place", "in_place")):
            rec = row.get(half) or {}
            s.busbw[i].append(float(rec.get("bus_bw", float("nan"))))
            t = rec.get("time", rec.get("cpu_time", float("nan")))
            s.time[i].append(float(t))
    many = len(groups) > 1
    for (typ, op, root, cycle), s in groups.items():
        extra = [str(typ)]
        if op not in (None, "", "none"):
            extra.append(str(op))
        if root not in ("", "-1"):
            extra.append(f"root {root}")
        if max(cycles.values(), default=1) > 1:
            extra.append(f"cycle {cycle}")
        s.label = f"{base} ({', '.join(extra)})" if many or extra != ["float"] else base
    return list(groups.values())


def plot_docs(docs: list[tuple[str | None, dict]], path: str) -> None:
    """Draw every series of every (label, document) into ``path``."""
    plt = figure.pyplot("plotting")
    fig, (ax_bw, ax_t) = plt.subplots(1, 2, figsize=(12, 4.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    k = 0
    for label, doc in docs:
        for s in series_of(doc, label):
            color = colors[k % len(colors)]
            k += 1
            pts = [i for i, size in enumerate(s.sizes) if size > 0]
            x = [s.sizes[i] for i in pts]
            for half, style in ((0, "-"), (1, "--")):
                name = f"{s.label} {'out-of-place' if half == 0 else 'in-place'}"
                ax_bw.plot(x, [s.busbw[half][i] for i in pts], style, marker=".",
                           color=color, label=name)
                ax_t.plot(x, [s.time[half][i] for i in pts], style, marker=".",
                          color=color, label=name)
    for ax, ylabel in ((ax_bw, "busbw (GB/s)"), (ax_t, "time (us)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax_bw.set_title("bus bandwidth")
    ax_t.set_title("time per operation")
    if k:
        ax_t.legend(fontsize="small", loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _setting(doc: dict, name: str) -> str | None:
    for item in doc.get("env") or []:
        key, _, value = str(item).partition("=")
        if key == name:
            return value
    return None


def _distinct(docs: list[tuple[str | None, dict]], paths: list[str],
              given: int) -> list[tuple[str | None, dict]]:
    """Files whose default labels collide are told apart by what differs between them —
    the transport, the rank count — else by file name."""
    labels = [lab or _run_label(doc, "run") for lab, doc in docs]
    out = list(docs)
    for i, (_lab, doc) in enumerate(docs):
        if i < given or labels.count(labels[i]) == 1:
            continue
        same = [j for j, x in enumerate(labels) if x == labels[i]]
        bits = []
        for name, get in (("transport", lambda d: _setting(d, "RINGTREE_TRANSPORT")),
                          ("ranks", lambda d: (d.get("config") or {}).get("ngpus"))):
            values = [get(docs[j][1]) for j in same]
            if len(set(map(str, values))) == len(same):
                bits.append(f"{name} {get(doc)}")
        if not bits:
            bits.append(os.path.basename(paths[i]))
        out[i] = (f"{labels[i]} [{', '.join(bits)}]", doc)
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="ringtree perf plot",
                                description="Plot busbw and time against size from -J files.")
    p.add_argument("files", nargs="+", help="JSON files written with -J")
    p.add_argument("-o", "--output", default="perf.png", help="image to write (default perf.png)")
    p.add_argument("--label", action="append", default=[],
                   help="label for each file, in order (default: backend and collective)")
    try:
        ns = p.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    docs = []
    for i, path in enumerate(ns.files):
        try:
            doc = load_json(path)
        except (OSError, ValueError) as e:
            print(f"ringtree perf plot: cannot read {path}: {e}", file=sys.stderr)
            return 2
        label = ns.label[i] if i < len(ns.label) else None
        if label is None and len(ns.files) > 1 and _run_label(doc, "") == "":
            label = os.path.basename(path)
        docs.append((label, doc))
    docs = _distinct(docs, ns.files, len(ns.label))
    return 0 if figure.write("ringtree perf plot", ns.output,
                             lambda path: plot_docs(docs, path)) else 2
