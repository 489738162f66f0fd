"""The butterflies' XOR fold against the unfolded run, where one sender's sends tie.

Usage: python benchmarks/sim_fold_ties.py [--sizes 64K,128K,...] [--presets N,...]
       [--engines native,python]

For every butterfly preset of ``tests/test_sim_fold.py`` (``dgx_h100`` ×4, ×8 with
``leaf_ports=2``, ``dgx_a100`` ×8 with 4 leaf ports and 2 GPUs and NICs a node,
``fat_tree2`` ×32, ``fat_tree3`` ×64, ``torus`` ×16), both butterflies (Rabenseifner,
recursive doubling), every size (64 KiB–4 MiB by default) and both models, the all-reduce
is simulated folded (the symmetry found) and with every rank (``symmetry=False``), and
compared: the time, every simulated step's start and end, every rank's finish and the
events. ``--engines``: the compiled heap (``native``) and/or the Python one (``python``,
``RINGTREE_SIM_NATIVE=0``), each in its own process. One line per case that differs,
then a count, the unfolded times of the cases where one sender's sends tie (the ×4 and
×8 Rabenseifner rows) and the CPU seconds taken.

The engines serve a link's simultaneous arrivals by message id; message ids number a
sender's connections in the order it first sends on them
(:func:`ringtree.sim.compile.pairing.issue_order`), which the folds keep. Numbered by
receiver, 5 of these 192 cases folded inexactly (Rabenseifner on ``dgx_h100`` ×4 at
1–4 MiB and ×8 at 1 MiB, aware).
"""

from __future__ import annotations

import os
import subprocess
import sys

MiB = 1 << 20
SIZES = "64K,128K,256K,512K,1M,2M,3M,4M"
PRESETS = {"dgx_h100x4": ("dgx_h100", 4, {}),
           "dgx_h100x8": ("dgx_h100", 8, {"leaf_ports": 2}),
           "dgx_a100x8": ("dgx_a100", 8, {"leaf_ports": 4, "gpus_per_node": 2,
                                          "nics_per_node": 2}),
           "fat_tree2x32": ("fat_tree2", 32, {}), "fat_tree3x64": ("fat_tree3", 64, {}),
           "torusx16": ("torus", 16, {})}


def differs(algo: str, topo, nbytes: int, model: str) -> tuple[str | None, float]:
    """Why the folded run is not the unfolded one (None: it is), and the unfolded time."""
    from ringtree.sim import simulate

    f = simulate("all_reduce", algo, topo, nbytes, model=model, max_work=0)
    w = simulate("all_reduce", algo, topo, nbytes, model=model, symmetry=False,
                 max_work=0)
    why = None
    if f.time_ns != w.time_ns:
        why = f"time {f.time_ns!r} folded, {w.time_ns!r} unfolded"
    elif f.result is not None and w.result is not None:
        fr, wr, g = f.result, w.result, f.simulated
        k = len(fr.step_done)
        if fr.step_done != wr.step_done[:k] or fr.step_start != wr.step_start[:k]:
            why = "step times"
        elif [fr.rank_done[r % g] for r in range(topo.nranks)] != wr.rank_done:
            why = "ranks' finish"
        elif f.events * (topo.nranks // g) != w.events:
            why = f"events {f.events} x {topo.nranks // g} vs {w.events}"
    return why, w.time_ns


def scan(presets: list[str], sizes: list[int]) -> int:
    """Every case in this process's engine; prints the differing ones, returns how many."""
    from ringtree.sim.machine import presets as P

    bad = total = 0
    tied = []
    for key in presets:
        name, nodes, kw = PRESETS[key]
        topo = P.get(name, nodes, **kw)
        for algo in ("rabenseifner", "recursive_doubling"):
            for nbytes in sizes:
                for model in ("aware", "unaware"):
                    why, t = differs(algo, topo, nbytes, model)
                    total += 1
                    if why is not None:
                        bad += 1
                        print(f"  differs: {key} {algo} {nbytes:,d} B {model}: {why}")
                    if algo == "rabenseifner" and model == "aware" and \
                            key in ("dgx_h100x4", "dgx_h100x8") and MiB <= nbytes <= 4 * MiB:
                        tied.append(f"{key} {nbytes // MiB} MiB {t:,.2f} ns")
    print(f"  {bad} of {total} cases differ; unfolded: " + "; ".join(tied))
    return bad


def main() -> int:
    args = sys.argv[1:]

    def opt(name: str, default: str) -> str:
        return args[args.index(name) + 1] if name in args else default

    if "--child" in args:
        from ringtree.perf.flags import parse_size

        sizes = [parse_size(x, "--sizes") for x in opt("--sizes", SIZES).split(",")]
        return int(scan(opt("--presets", ",".join(PRESETS)).split(","), sizes) > 0)
    worst = 0
    for engine in opt("--engines", "native,python").split(","):
        env = dict(os.environ)
        env.pop("RINGTREE_SIM_NATIVE", None)
        if engine == "python":
            env["RINGTREE_SIM_NATIVE"] = "0"
        before = os.times()
        print(f"{engine}:", flush=True)
        rc = subprocess.run([sys.executable, __file__, "--child", *args], env=env).returncode
        after = os.times()
        cpu = (after.children_user - before.children_user
               + after.children_system - before.children_system)
        print(f"  {cpu:.0f} s of CPU", flush=True)
        worst = max(worst, rc)
    return worst


if __name__ == "__main__":
    sys.exit(main())
