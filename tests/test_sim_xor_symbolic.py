"""The butterflies' XOR templates (:mod:`ringtree.sim.compile.xor_symbolic`): the symbolic
rank's arithmetic is the integers' at every rank, a template is every rank's generated
Program, its masks are exactly the renaming that maps each rank's Program onto its
image's, the fold found from it is the one the ranks' scan finds, and the folded run
equals the unfolded one bit for bit."""

from __future__ import annotations

import itertools

import pytest

from ringtree.ir import program as ir
from ringtree.ir.program import Collective, Program, inp, out
from ringtree.schedules import Options, generate
from ringtree.sim import count_for, simulate
from ringtree.sim.compile import symbolic, xor_symbolic
from ringtree.sim.compile.symbolic import NotSymmetric
from ringtree.sim.compile.xor_symbolic import XSym, connections, xor_masks, xor_template
from ringtree.sim.fold import choice, symmetry
from ringtree.sim.machine import presets
from tests.test_sim_fold import _exact

ALGOS = ("rabenseifner", "recursive_doubling")


def test_arithmetic_is_the_integers_at_every_rank():
    n = 16
    xs = [XSym(n - 1), XSym(0b1010, 0b0100), XSym(0b0011, 0b1000)]
    for x, k in itertools.product(xs, (0, 1, 4, 6, 15, ~3, ~8)):
        for op in (lambda a, b: a ^ b, lambda a, b: b ^ a, lambda a, b: a & b,
                   lambda a, b: b & a):
            got = op(x, k)
            assert [got if type(got) is int else got.at(r) for r in range(n)] == \
                [op(x.at(r), k) for r in range(n)]
    for x, y in itertools.product(xs, xs):
        got = x ^ y
        assert [got if type(got) is int else got.at(r) for r in range(n)] == \
            [x.at(r) ^ y.at(r) for r in range(n)]
    x = XSym(0b0011, 0b1000)
    assert [(x + 16).at(r) for r in range(n)] == [x.at(r) + 16 for r in range(n)]
    assert [(x | 4).at(r) for r in range(n)] == [x.at(r) | 4 for r in range(n)]
    assert [(x - 8).at(r) for r in range(n)] == [x.at(r) - 8 for r in range(n)]
    assert (x < 16, x >= 8, x > 11, x <= 7, bool(x)) == (True, True, False, False, True)
    for bad in (lambda: x + 1, lambda: x - 1, lambda: x < 10, lambda: bool(XSym(3)),
                lambda: x * 2, lambda: x // 2, lambda: x % 2, lambda: hash(x),
                lambda: x == 3, lambda: int(x)):
        with pytest.raises(NotSymmetric):
            bad()


@pytest.mark.parametrize("algo", ALGOS)
def test_template_is_every_rank(algo):
    for n, ch in ((4, 1), (8, 2), (32, 1), (64, 3)):
        o = Options(channels=ch)
        t = xor_template(Collective.ALL_REDUCE, algo, n, o)
        for r in range(n):
            p = generate(Collective.ALL_REDUCE, algo, n, r, o)
            assert symbolic.instantiate(t, r).channels == p.channels
            assert symbolic.reads(t, p)
        conns = {(r, q, c) for r in range(n)
                 for c, chan in enumerate(generate(Collective.ALL_REDUCE, algo, n, r,
                                                   o).channels)
                 for s in chan for q in s.send_to}
        assert set(map(tuple, connections(t).tolist())) == conns
    assert xor_template(Collective.ALL_REDUCE, algo, 12, Options()) is None   # folds in
    assert xor_template(Collective.ALL_REDUCE, "ring", 8, Options()) is None


def _renamed(p: Program, d: int, masks: dict) -> tuple:
    """p with every peer XOR d and every reference's chunks XOR its buffer's mask, as
    (peers, chunk sets) per step."""
    def ref(x):
        return None if x is None else (x.buf, frozenset(j ^ masks.get(x.buf, 0)
                                                        for j in x.chunks()))
    return tuple((tuple(q ^ d for q in s.recv_from), tuple(q ^ d for q in s.send_to),
                  s.reduce, ref(s.src), ref(s.dst)) for ch in p.channels for s in ch)


@pytest.mark.parametrize("algo", ALGOS)
def test_masks_map_every_rank_onto_its_image(algo):
    """Where the masks prove a fold, rank r XOR d's Program is rank r's renamed by them,
    for every rank and generator d; where they do not, the ranks' own proof fails too."""
    n, o = 32, Options(channels=2)
    t = xor_template(Collective.ALL_REDUCE, algo, n, o)
    progs = [generate(Collective.ALL_REDUCE, algo, n, r, o) for r in range(n)]
    for g in (1, 2, 4, 8):
        ms = xor_masks(t, g, False)
        assert ms is not None and len(ms) == (n // g).bit_length() - 1
        for k, m in enumerate(ms):
            d = g << k
            for r in range(n):
                want = _renamed(progs[r ^ d], 0, {})
                assert _renamed(progs[r], d, m) == want, (algo, g, k, r)
    assert xor_masks(t, 16, False) is None       # two blocks: not a XOR fold here
    assert xor_masks(t, 4, True) is None         # in place: not proved here


def _rooted(n: int, r, opts: Options) -> Program:
    """Every rank sends to rank 0: a peer that does not move with the rank."""
    return Program(Collective.ALL_REDUCE, "rooted", n, r, 1,
                   ((ir.send(0, inp(0)), ir.recv(0, out(0))),))


def _misaligned(n: int, r, opts: Options) -> Program:
    """Three chunks from a rank-dependent start: no one mask maps the runs."""
    return Program(Collective.ALL_REDUCE, "misaligned", n, r, 4 * n,
                   ((ir.send(r ^ 1, inp((r & 4) ^ 1, 3)), ir.recv(r ^ 1, out(0))),))


def test_masks_refuse_what_they_cannot_prove():
    n = 16
    for gen in (_rooted, _misaligned):
        t = gen(n, XSym(n - 1), Options())
        assert all(xor_masks(t, g, False) is None for g in (1, 2, 4))


@pytest.mark.parametrize("make", [lambda: presets.get("dgx_h100", 4),
                                  lambda: presets.get("dgx_h100", 8, leaf_ports=2),
                                  lambda: presets.get("fat_tree2", 32)])
def test_template_fold_is_the_scanned_fold(make, monkeypatch):
    """:func:`.symmetry.find` with the template gives the ranks' scan's fold (size, kind
    and link orbits) without scanning, and the run folded so equals the unfolded one."""
    topo = make()
    for algo in ALGOS:
        for nbytes in (64 << 10, 256 << 10):
            progs = choice.Lazy(Collective.ALL_REDUCE, algo, topo.nranks,
                                choice.options(topo))
            count = count_for(Collective.ALL_REDUCE, nbytes, topo.nranks)
            key = (Collective.ALL_REDUCE, algo, topo.nranks, choice.options(topo),
                   id(topo), tuple(topo.ranks), True, False)
            scanned = symmetry.find(progs, topo, list(topo.ranks), count, True)
            with monkeypatch.context() as m:
                m.setattr(symmetry, "_scan", None)          # never called
                got = symmetry.find(progs, topo, list(topo.ranks), count, True, key=key)
            assert got is not None and got == scanned and got.links == scanned.links
            assert _exact(algo, topo, nbytes) == got.g


@pytest.mark.parametrize("make", [lambda: presets.get("dgx_h100", 4),
                                  lambda: presets.get("dgx_a100", 8)])
def test_emptied_channels_compile_as_the_generated(make, monkeypatch):
    """Unfolded (8 B and 64 B: nothing folds), the Programs read off the template with
    the empty channels never made compile to the generated Programs' run: the same
    time, events, every step's start and end and every rank's finish."""
    topo = make()
    calls = []
    made = xor_symbolic.Emptied.of

    def spy(*a):
        calls.append(made(*a))
        return calls[-1]

    monkeypatch.setattr(xor_symbolic.Emptied, "of", staticmethod(spy))
    for nbytes in (8, 64):
        monkeypatch.setattr(xor_symbolic, "EMPTIED_FROM_STEPS", 1 << 60)
        want = simulate("all_reduce", "rabenseifner", topo, nbytes, max_work=0)
        monkeypatch.setattr(xor_symbolic, "EMPTIED_FROM_STEPS", 0)
        got = simulate("all_reduce", "rabenseifner", topo, nbytes, max_work=0)
        assert got.simulated == want.simulated == topo.nranks
        assert (got.time_ns, got.events) == (want.time_ns, want.events)
        assert got.result.step_start == want.result.step_start
        assert got.result.step_done == want.result.step_done
        assert got.result.rank_done == want.result.rank_done
    assert calls and all(c is not None and c.empty for c in calls)


def test_emptied_keeps_what_it_cannot_prove_empty():
    """A channel is emptied only where no rank names data in it and no channel kept may
    name its chunks; a rank whose kept channels move nothing gets its generated Program
    (``moving`` keeps every channel there)."""
    n, o = 16, Options(channels=4)
    t = xor_template(Collective.ALL_REDUCE, "rabenseifner", n, o)
    progs = [generate(Collective.ALL_REDUCE, "rabenseifner", n, r, o) for r in range(n)]
    e = xor_symbolic.Emptied.of(Collective.ALL_REDUCE, "rabenseifner", n, o, 2, progs)
    assert e is not None and e.empty == frozenset({1, 2, 3})
    for r in range(n):
        assert e[r].channels[0] == progs[r].channels[0] and not any(e[r].channels[1:])
    assert xor_symbolic.Emptied.of(Collective.ALL_REDUCE, "rabenseifner", n, o,
                                     4 * n * 4, progs) is None      # data everywhere
    pre = {b: [0] * (len(v) + 1) for b, v in symmetry.regions(t, 0).items()}
    assert xor_symbolic.empty_channels(t, pre) == frozenset()       # all empty: none kept
    v = XSym(n - 1)
    two = Program(Collective.ALL_REDUCE, "two", n, v, 4,
                  ((ir.send(v ^ 1, inp(0, 2)), ir.recv(v ^ 1, out(0, 2))),
                   (ir.send(v ^ 1, inp(1)), ir.recv(v ^ 1, out(1)))))
    lengths = {b: [0, 1, 1, 1, 1] for b in pre}         # data in chunk 0 alone
    assert xor_symbolic.empty_channels(two, lengths) == frozenset()  # chunk 1 is shared
