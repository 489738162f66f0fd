"""The symbolic checker over every registered (collective, algorithm).

- n = 1..64 for every pair (in place too for a subset of n, to keep the file fast),
  n = 128 and 256 for the log-step algorithms, with roots, channels and node layouts
  varied with n;
- a stricter deadlock model than the checker's: sends complete only once the receiver
  has posted the matching receive (a rendezvous transport, e.g. TCP beyond its socket
  buffers), and steps issue in order, each only after the earlier steps it conflicts with
  in memory have completed — the executor's rule. An algorithm that receives into what it
  is still sending deadlocks here at large sizes, though the checker (eager sends) passes;
- local copies between chunks of different sizes are rejected;
- broken programs must make the checker raise.
"""

from __future__ import annotations

import random

import pytest

from ringtree.ir import program as ir
from ringtree.ir.check import CheckError, check_programs, with_virtual
from ringtree.ir.program import Buf, Collective, Program, Step, copy, inp, out, scr
from ringtree.schedules import Options, algorithms, generate_all

PAIRS = [(c, a) for c in Collective for a in algorithms(c)]
LOG_STEP = {"recursive_doubling", "rabenseifner", "halving", "bruck", "dissemination", "tree"}
ROOTED = (Collective.BROADCAST, Collective.REDUCE, Collective.GATHER, Collective.SCATTER)
NO_IN_PLACE = (Collective.GATHER, Collective.SCATTER, Collective.BARRIER)
IN_PLACE_NS = set(range(1, 13)) | {16, 33, 64}


def _layout(n: int, i: int) -> tuple[int, ...] | None:
    """A node layout chosen by i: one node, one rank per node, ppn 2/3/4, round-robin,
    random."""
    kind = i % 7
    if kind == 0:
        return None
    if kind == 1:
        return tuple(range(n))
    if kind in (2, 3, 4):
        return tuple(r // kind for r in range(n))
    if kind == 5:
        return tuple(r % 3 for r in range(n))
    rng = random.Random(n)
    return tuple(rng.randrange(4) for _ in range(n))


def options_for(coll: Collective, algo: str, n: int, i: int = 0) -> Options:
    """Options varied with n (and i): roots, channels, node layouts, tree params."""
    j = n + i
    root = (0, n - 1, n // 2)[j % 3] if coll in ROOTED else 0
    channels = 1 + (j % 4 == 3) + (j % 8 == 7)
    params: list[tuple[str, object]] = []
    if algo in ("tree", "tree_updown") and coll is Collective.ALL_REDUCE:
        params.append(("pattern", ("balanced_tree", "split_tree", "tree")[j % 3]))
        if j % 5 == 4:
            params.append(("flat", True))
        params.append(("pipeline", 1 + j % 3))
    if algo == "hierarchical":
        inter = {Collective.ALL_REDUCE: ("ring", "tree", "rabenseifner", "direct",
                                         "recursive_doubling"),
                 Collective.BROADCAST: ("ring", "tree"),
                 Collective.ALL_GATHER: ("ring", "bruck", "recursive_doubling", "direct"),
                 Collective.REDUCE_SCATTER: ("ring", "halving", "direct")}[coll]
        params.append(("inter", inter[j % len(inter)]))
        if coll in (Collective.ALL_REDUCE, Collective.ALL_GATHER,
                    Collective.REDUCE_SCATTER) and j % 3:
            params.append(("pieces", 1 + j % 4))
    # NVLS all-gather / reduce-scatter run inside one NVLink domain only (across nodes
    # NCCL needs a CollNet plugin's iallgather / ireducescatter)
    one_domain = algo == "nvls" and coll is not Collective.ALL_REDUCE
    return Options(root=root, channels=channels, nodes=None if one_domain else _layout(n, j),
                   params=tuple(sorted(params)))


def copy_sizes_match(programs: list[Program]) -> None:
    """A local copy or reduce must move chunks of the same size class (the checker only
    compares the sizes of messages)."""
    for p in programs:
        for ch in p.channels:
            for s in ch:
                if s.src is not None and s.dst is not None:
                    a = [j % p.chunks for j in s.src.chunks()]
                    b = [j % p.chunks for j in s.dst.chunks()]
                    if a != b:
                        raise CheckError(f"{p.algo} rank {p.rank}: '{s}' copies chunks of "
                                         f"different sizes")


def rendezvous_deadlock(programs: list[Program], in_place: bool) -> str | None:
    """None if the programs complete when every send waits for its receiver; otherwise a
    description of where they hang. Models the executor's issue rule (see module doc)."""
    n = len(programs)
    steps: list[list[tuple[int, Step]]] = []          # per rank, (channel, step) by gid
    deps: list[list[set[int]]] = []
    for p in programs:
        flat = [(c, s) for c, ch in enumerate(p.channels) for s in ch]
        dl = [set(d) for d in p.memory_deps(in_place)]
        steps.append(flat)
        deps.append(dl)
    # pair the k-th send on (a, b, c) with the k-th receive on (a, b, c)
    sends: dict[tuple[int, int, int], list[int]] = {}
    recvs: dict[tuple[int, int, int], list[int]] = {}
    for r, flat in enumerate(steps):
        for g, (c, s) in enumerate(flat):
            for q in s.send_to:
                sends.setdefault((r, q, c), []).append(g)
            for q in s.recv_from:
                recvs.setdefault((q, r, c), []).append(g)
    in_msgs: dict[tuple[int, int], list[tuple[int, int]]] = {}    # receiver step -> senders
    out_msgs: dict[tuple[int, int], list[tuple[int, int]]] = {}   # sender step -> receivers
    for (a, b, c), gs in sends.items():
        for gs_, gr in zip(gs, recvs.get((a, b, c), [])):
            in_msgs.setdefault((b, gr), []).append((a, gs_))
            out_msgs.setdefault((a, gs_), []).append((b, gr))
    issued = [[False] * len(f) for f in steps]
    ready = [[False] * len(f) for f in steps]      # issued and its data has arrived
    done = [[False] * len(f) for f in steps]
    nxt = [dict.fromkeys(range(len(p.channels)), 0) for p in programs]
    order = [{c: [g for g, (cc, _) in enumerate(f) if cc == c] for c in range(len(p.channels))}
             for p, f in zip(programs, steps)]
    changed = True
    while changed:
        changed = False
        for r in range(n):
            for c, gl in order[r].items():
                while nxt[r][c] < len(gl) and all(done[r][d] for d in deps[r][gl[nxt[r][c]]]):
                    issued[r][gl[nxt[r][c]]] = True
                    nxt[r][c] += 1
                    changed = True
            for g in range(len(steps[r])):
                if issued[r][g] and not ready[r][g] and all(
                        ready[a][ga] for a, ga in in_msgs.get((r, g), [])):
                    ready[r][g] = changed = True
                if ready[r][g] and not done[r][g] and all(
                        issued[b][gb] for b, gb in out_msgs.get((r, g), [])):
                    done[r][g] = changed = True
    for r in range(n):
        for g, ok in enumerate(done[r]):
            if not ok:
                c, s = steps[r][g]
                return f"rank {r} channel {c} step '{s}' never completes"
    return None


def _check_one(coll: Collective, algo: str, n: int, opts: Options, in_place: bool) -> None:
    programs = generate_all(coll, algo, n, opts)
    copy_sizes_match(programs)
    modes = [False]
    if in_place and coll not in NO_IN_PLACE and all(p.in_place_ok for p in programs):
        modes.append(True)
    for mode in modes:
        try:
            check_programs(programs, in_place=mode)
        except CheckError as e:
            raise AssertionError(f"{algo} {coll.value} n={n} {opts} in_place={mode}: {e}") from e
        if n <= 16 and coll is not Collective.BARRIER:   # a barrier's token is never large
            hang = rendezvous_deadlock(with_virtual(programs), mode)
            assert hang is None, f"{algo} {coll.value} n={n} {opts} in_place={mode}: {hang}"


# NVLS (n² messages through its switch ranks) has its own sweep, n = 2..72 in one NVLink
# domain and across nodes: tests/test_nvls.py
HOST = [(c, a) for c, a in PAIRS if not a.startswith("nvls")]


@pytest.mark.parametrize("coll,algo", HOST, ids=[f"{a}-{c.value}" for c, a in HOST])
def test_checker_n1_to_64(coll, algo):
    for n in range(1, 65):
        _check_one(coll, algo, n, options_for(coll, algo, n), n in IN_PLACE_NS)


@pytest.mark.parametrize("coll,algo", [(c, a) for c, a in PAIRS if a in LOG_STEP],
                         ids=[f"{a}-{c.value}" for c, a in PAIRS if a in LOG_STEP])
@pytest.mark.parametrize("n", [128, 256])
def test_checker_log_step_large(coll, algo, n):
    opts = options_for(coll, algo, n)
    if algo == "tree" and coll is Collective.ALL_REDUCE:
        opts = Options(nodes=tuple(range(n)), params=(("pattern", "balanced_tree"),))
    _check_one(coll, algo, n, opts, in_place=False)


@pytest.mark.parametrize("coll,algo", PAIRS, ids=[f"{a}-{c.value}" for c, a in PAIRS])
def test_checker_more_options(coll, algo):
    """Other roots, channels and layouts for small n, in place."""
    for n in (2, 3, 5, 6, 8, 9):
        for i in range(1, 7):
            _check_one(coll, algo, n, options_for(coll, algo, n, i), True)


def test_rendezvous_model_catches_receive_into_own_send():
    """Both partners receive into the buffer they are still sending: eager sends finish,
    rendezvous sends hang."""
    progs = [Program(Collective.ALL_REDUCE, "x", 2, r, 1,
                     ((ir.send(1 - r, out(0)), ir.recv_reduce_copy(1 - r, inp(0), out(0))),))
             for r in range(2)]
    # out-of-place it is merely wrong (reads the output before writing it): use in place
    assert rendezvous_deadlock(progs, in_place=True) is not None
    good = [generate_all("all_reduce", "recursive_doubling", 2)]
    assert rendezvous_deadlock(good[0], in_place=True) is None


# ---- negative tests: broken programs must be rejected ------------------------------------

def _ring(n: int) -> list[Program]:
    return generate_all(Collective.ALL_REDUCE, "ring", n)


def _replace(p: Program, channel: int, index: int, step: Step | None) -> Program:
    ch = list(p.channels[channel])
    if step is None:
        del ch[index]
    else:
        ch[index] = step
    chans = list(p.channels)
    chans[channel] = tuple(ch)
    return Program(p.collective, p.algo, p.nranks, p.rank, p.chunks, tuple(chans), p.root,
                   p.scratch, p.in_place_ok)


def test_broken_wrong_peer_deadlocks():
    progs = _ring(4)
    s = progs[2].channels[0][1]
    progs[2] = _replace(progs[2], 0, 1, Step(src=s.src, recv_from=(3,), send_to=s.send_to,
                                             reduce=True))
    with pytest.raises(CheckError, match="deadlock|unreceived"):
        check_programs(progs)


def test_broken_missing_step():
    progs = _ring(4)
    progs[1] = _replace(progs[1], 0, len(progs[1].channels[0]) - 1, None)
    with pytest.raises(CheckError):
        check_programs(progs)


def test_broken_double_counting():
    # rank 0 reduces its own input twice in the one-shot all-reduce
    progs = generate_all(Collective.ALL_REDUCE, "direct", 3)
    ch = progs[0].channels[0]
    i = next(i for i, s in enumerate(ch) if s.name == "copy")
    progs[0] = _replace(progs[0], 0, i, ir.copy(inp(0), scr(0)))
    progs[0] = Program(Collective.ALL_REDUCE, "direct", 3, 0, 1,
                       ((*progs[0].channels[0][:i + 1], ir.reduce(inp(0), scr(0)),
                         *progs[0].channels[0][i + 1:]),), scratch=1)
    with pytest.raises(CheckError, match="double counting"):
        check_programs(progs)


def test_broken_reduction_order_differs_between_ranks():
    # rank 1 reduces in a different order than the others: same sum, different bits
    progs = generate_all(Collective.ALL_REDUCE, "direct", 3)
    steps = [ir.send(2, inp(0)), ir.send(0, inp(0)), ir.recv(2, scr(0)),
             ir.reduce(inp(0), scr(0)), ir.recv_reduce_copy(0, scr(0)), copy(scr(0), out(0))]
    progs[1] = Program(Collective.ALL_REDUCE, "direct", 3, 1, 1, (tuple(steps),), scratch=1)
    with pytest.raises(CheckError, match="different order"):
        check_programs(progs)


def test_broken_output_never_written():
    progs = generate_all(Collective.ALL_GATHER, "direct", 3)
    progs[2] = _replace(progs[2], 0, 0, ir.send(0, inp(0)))   # drop the copy to out[2]
    with pytest.raises(CheckError):
        check_programs(progs)


def test_broken_size_mismatch():
    progs = generate_all(Collective.ALL_GATHER, "bruck", 4)
    ch = progs[0].channels[0]
    i = next(i for i, s in enumerate(ch) if s.name == "recv")
    s = ch[i]
    progs[0] = _replace(progs[0], 0, i, ir.recv(s.recv_from[0], out(s.dst.index, 2)))
    with pytest.raises(CheckError):
        check_programs(progs)


def test_broken_channels_overlap():
    progs = generate_all(Collective.ALL_REDUCE, "tree", 4, Options(channels=1))
    for r, p in enumerate(progs):   # make every channel 1 write channel 0's chunks
        ch1 = tuple(Step(src=s.src and inp(s.src.index - 2), dst=s.dst and out(s.dst.index - 2),
                         recv_from=s.recv_from, send_to=s.send_to, reduce=s.reduce)
                    for s in p.channels[1])
        progs[r] = Program(p.collective, p.algo, 4, r, p.chunks, (p.channels[0], ch1))
    with pytest.raises(CheckError, match="channels|different order|double"):
        check_programs(progs)


def test_broken_undefined_read():
    progs = generate_all(Collective.ALL_REDUCE, "direct", 2)
    progs[0] = _replace(progs[0], 0, 0, ir.send(1, scr(0)))   # scratch read before written
    with pytest.raises(CheckError, match="undefined"):
        check_programs(progs)


def test_copy_size_classes_are_checked():
    bad = Program(Collective.ALL_REDUCE, "x", 1, 0, 2, ((copy(inp(0), out(1)),
                                                        copy(inp(1), out(0))),))
    with pytest.raises(CheckError, match="different sizes"):
        copy_sizes_match([bad])
    assert Buf.SCRATCH.letter == "s"


@pytest.mark.parametrize("coll,algo", PAIRS, ids=[f"{a}-{c.value}" for c, a in PAIRS])
def test_memory_deps_by_runs_is_by_slots(coll, algo):
    """The two ways of :meth:`Program.memory_deps` agree on every rank of every schedule,
    out of place and in place, several channels, layouts and roots."""
    for n in (1, 2, 3, 5, 8, 12, 16):
        for i in range(4):
            opts = options_for(coll, algo, n, i)
            programs = with_virtual(generate_all(coll, algo, n, opts))
            for p in programs:
                for mode in (False, True):
                    assert p.deps_by_runs(mode) == p.deps_by_slots(mode), (n, opts, p.rank)
