"""Symbolic checker: run every rank's Program on symbols and verify the collective.

Each chunk slot holds a symbolic value: a leaf ``in(rank, chunk)`` or a reduction node
``⊕(a, b)``. Nodes are interned with commutative children sorted, so two slots hold the
same id exactly when they hold the same reduction *tree* — i.e. the same bits for any
commutative operator (IEEE add and multiply are commutative, not associative). Checking
ids, not just contribution sets, proves that every rank ends with bitwise-identical
results (MSCCLang's checker, extended with reduction order).

Also checked: messages match in size under the in-order rule per (sender, receiver,
channel); no cyclic wait (with unbounded buffering, which is what the executor gives a
sender: it never blocks on a send); nothing is double-counted; nothing undefined is read;
no message is left unreceived; channels of one rank never write what another channel
touches; in-place runs (input aliased into the output, as the API allows) stay correct.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringtree.ir.program import Buf, Collective, Program, Ref, Step
from ringtree.ir.walk import ordered_deps, walk


class CheckError(AssertionError):
    """A schedule violates its collective's postcondition or the IR's rules. ``where``:
    (rank, channel, step index) of the step at fault, where one is."""

    def __init__(self, what: str, where: tuple[int, int, int] | None = None) -> None:
        super().__init__(what)
        self.where = where


@dataclass(frozen=True)
class CheckReport:
    collective: Collective
    algo: str
    nranks: int
    messages: int          # point-to-point messages over all ranks
    max_steps: int         # most steps on one rank
    depth: int             # critical path, in dependent steps (the α term of the cost)
    in_place: bool


class _Values:
    """Interning table for symbolic values: leaves and commutative reduction nodes."""

    def __init__(self) -> None:
        self.ids: dict[tuple, int] = {}
        self.contrib: list[frozenset] = []

    def leaf(self, *key: object) -> int:
        k = ("leaf", *key)
        if k not in self.ids:
            self.ids[k] = len(self.contrib)
            self.contrib.append(frozenset([key]))
        return self.ids[k]

    def combine(self, a: int, b: int, allow_overlap: bool) -> int:
        ca, cb = self.contrib[a], self.contrib[b]
        if not allow_overlap and ca & cb:
            raise CheckError(f"double counting: contributions {sorted(ca & cb)} reduced twice")
        k = ("op", min(a, b), max(a, b))
        if k not in self.ids:
            self.ids[k] = len(self.contrib)
            self.contrib.append(ca | cb)
        return self.ids[k]


def _signature(p: Program, ref: Ref) -> tuple[int, ...]:
    """Size class of each chunk of a region: chunk j is sub-chunk j % chunks of a block,
    or one class for every chunk when the Program runs only on counts its chunks divide
    (``meta["equal_chunks"]``: an imported MSCCL algorithm, which its executors run only
    then)."""
    n = p.buffer_chunks(ref.buf)
    if ref.index < 0 or ref.index + ref.count > n:
        raise CheckError(f"rank {p.rank}: {ref} outside {ref.buf.name} ({n} chunks)")
    if p.meta.get("equal_chunks"):
        return (0,) * ref.count
    return tuple(j % p.chunks for j in ref.chunks())


def _channel_conflicts(p: Program, key) -> None:
    """Two channels must not touch a chunk one of them writes (they run concurrently).
    One pass over the slots (a Program of k channels costs its steps, not k²)."""
    readers: dict = {}
    writers: dict = {}
    for c, ch in enumerate(p.channels):
        for s in ch:
            if s.src is not None:
                for j in s.src.chunks():
                    readers.setdefault(key(s.src.buf, j), set()).add(c)
            if s.dst is not None:
                for j in s.dst.chunks():
                    writers.setdefault(key(s.dst.buf, j), set()).add(c)
    pairs = [(min(w, o), max(w, o)) for slot, ws in writers.items()
             for w in ws for o in ws | readers.get(slot, set()) if o != w]
    if pairs:
        a, b = min(pairs)
        raise CheckError(f"rank {p.rank}: channels {a} and {b} touch the same chunks")


def with_virtual(programs: list[Program]) -> list[Program]:
    """The real ranks' Programs followed by their virtual ranks' (CollNet switches)."""
    virtual = programs[0].meta.get("virtual_programs", ()) if programs else ()
    return list(programs) + [v for v in virtual if v.rank >= len(programs)]


def check_programs(programs: list[Program], in_place: bool = False) -> CheckReport:
    """Symbolically execute one Program per rank and verify the collective's result.

    Virtual ranks (in-network switches, numbered from ``nranks`` up) are taken from the
    real Programs' ``meta["virtual_programs"]`` when not given, and run like any rank:
    what they reduce is interned the same way, so the proof of bitwise agreement covers
    the in-network reduction order too. They hold no input of their own.
    """
    if not programs:
        raise CheckError("no programs")
    n = programs[0].nranks
    if len(programs) == n:
        programs = with_virtual(programs)
    _check_ranks(programs, n)
    coll, algo = programs[0].collective, programs[0].algo
    ex = _Symbolic(programs, n, in_place)

    def run(r: int, c: int, i: int, s: Step, received: list) -> tuple:
        try:
            return ex.run(r, c, i, s, received)
        except CheckError as e:
            raise CheckError(f"rank {r} channel {c} step {i} ({s}): {e}", (r, c, i)) from None

    stuck, queues = walk(programs, run, ordered_deps(programs, in_place))
    if stuck:
        desc = "; ".join(f"rank {r} ch {c} waits at '{s}'" for r, c, s in stuck[:6])
        raise CheckError(f"{algo} {coll.value} n={n} deadlocks: {desc}")
    left = {k: len(q) for k, q in queues.items()}
    if left:
        raise CheckError(f"{algo} {coll.value} n={n}: unreceived messages {left}")

    _postcondition(coll, programs[:n], ex.mem, ex.keys, ex.vals, ex.last)
    return CheckReport(coll, algo, n, ex.messages, max(p.steps for p in programs[:n]),
                       ex.depth, in_place)


def _check_ranks(programs: list[Program], n: int) -> None:
    """One program per rank, the same collective, virtual ranks marked, valid peers."""
    coll, total = programs[0].collective, len(programs)
    for r, p in enumerate(programs):
        if p.rank != r or p.nranks != n or p.collective is not coll:
            raise CheckError(f"program {r} is for rank {p.rank}/{p.nranks} {p.collective}")
        if r >= n and p.meta.get("virtual") is None:
            raise CheckError(f"program {r} is beyond the {n} ranks but not a virtual rank")
        for ch in p.channels:
            for s in ch:
                for peer in (*s.recv_from, *s.send_to):
                    if not 0 <= peer < total or peer == r:
                        raise CheckError(f"rank {r} exchanges with invalid peer {peer}")


class _Symbolic:
    """Every rank's memory of symbolic values, and the step :func:`walk` runs on it."""

    def __init__(self, programs: list[Program], n: int, in_place: bool,
                 vals: _Values | None = None):
        self.programs, self.algo = programs, programs[0].algo
        self.vals = _Values() if vals is None else vals  # shared: compare two schedules
        self.barrier = programs[0].collective is Collective.BARRIER
        self.keys = [p.storage_map(in_place) for p in programs]
        self.mem: list[dict[tuple[Buf, int], int | None]] = []
        for r, p in enumerate(programs):
            m: dict[tuple[Buf, int], int | None] = {}
            for j in range(p.buffer_chunks(Buf.INPUT) if r < n else 0):
                m[(Buf.INPUT, j)] = self.vals.leaf(r, j)
            if self.barrier:
                m[(Buf.SCRATCH, 0)] = self.vals.leaf(r, 0)
            self.mem.append(m)
            if not p.meta.get("ordered_channels"):
                _channel_conflicts(p, self.keys[r])
        self.last: list[dict] = [{} for _ in programs]  # slot -> (channel, step) writing it
        self.clock = [[0] * len(p.channels) for p in programs]
        self.messages = self.depth = 0

    def read(self, r: int, ref: Ref) -> list[int]:
        out = []
        for j in ref.chunks():
            v = self.mem[r].get(self.keys[r](ref.buf, j))
            if v is None:
                raise CheckError(f"rank {r} reads undefined {ref.buf.name}[{j}] in {self.algo}")
            out.append(v)
        return out

    def run(self, r: int, c: int, _i: int, s: Step, received: list) -> tuple:
        p, vals, barrier = self.programs[r], self.vals, self.barrier
        sig = _signature(p, s.ref)
        if s.src is not None and s.dst is not None:
            _signature(p, s.dst)
        value = self.read(r, s.src) if s.src is not None else None
        if s.reduce and not s.recv_from:  # local reduce: dst = dst ⊕ src
            assert s.dst is not None and value is not None
            value = [vals.combine(a, b, barrier) for a, b in zip(self.read(r, s.dst), value)]
        t = self.clock[r][c]
        for peer, (msg, msig, mt) in zip(s.recv_from, received):
            t = max(t, mt)
            if msig != sig:
                raise CheckError(f"rank {r} channel {c}: receives {len(msig)} chunk(s) of "
                                 f"shape {msig} from {peer} into {s.ref} of shape {sig}")
            if value is None or not s.reduce:
                value = list(msg)
            else:
                value = [vals.combine(a, b, barrier) for a, b in zip(value, msg)]
        assert value is not None
        t += 1
        self.clock[r][c] = t
        self.depth = max(self.depth, t)
        if s.dst is not None:
            for j, v in zip(s.dst.chunks(), value):
                key = self.keys[r](s.dst.buf, j)
                self.mem[r][key] = v
                self.last[r][key] = (c, _i)
        self.messages += len(s.send_to)
        return tuple(value), sig, t


def _postcondition(coll, programs, mem, keys, vals: _Values, last=None) -> None:
    n = len(programs)
    p0 = programs[0]
    c, root = p0.chunks, p0.root

    def got(r: int, j: int) -> int | None:
        return mem[r].get(keys[r](Buf.OUTPUT, j))

    def fail(r: int, j: int, what: str) -> CheckError:
        at = last[r].get(keys[r](Buf.OUTPUT, j)) if last is not None else None
        return CheckError(f"{p0.algo} {coll.value} n={n}: rank {r} output[{j}] {what}",
                          (r, *at) if at is not None else None)

    def expect(r: int, j: int, want: set, same_as: int | None = None) -> int:
        v = got(r, j)
        if v is None:
            raise fail(r, j, "never written")
        if vals.contrib[v] != want:
            raise fail(r, j, f"holds {sorted(vals.contrib[v])}, expected {sorted(want)}")
        if same_as is not None and v != same_as:
            raise fail(r, j, "reduced in a different order than rank 0's (results would "
                       "differ in bits)")
        return v

    spec = coll.spec
    if spec.sources is not None:  # the postcondition, read from the collective's record
        nout = spec.blocks(n)[1] * c
        first: dict[int, int] = {}
        for r in range(n):
            for j in range(nout):
                want = spec.expected(n, r, root, c, j)
                if want is not None:
                    v = expect(r, j, want, first.get(j) if spec.agree else None)
                    first.setdefault(j, v)
    elif coll is Collective.BARRIER:
        everyone = {(q, 0) for q in range(n)}
        for r in range(n):
            v = mem[r].get((Buf.SCRATCH, 0))
            if n > 1 and (v is None or vals.contrib[v] != everyone):
                raise CheckError(f"barrier n={n}: rank {r} may leave before every rank arrived")



def same_outputs(first: list[Program], second: list[Program], in_place: bool = False) -> bool:
    """Do two Programs of one collective (the same ranks, chunks and buffers) leave every
    output chunk of every rank holding the same value, reduced in the same order: the same
    bits on every input? (An algorithm exported and imported again must.)"""
    if len(first) != len(second) or first[0].chunks != second[0].chunks:
        return False
    n, vals = first[0].nranks, _Values()
    mems = []
    for programs in (first, second):
        ex = _Symbolic(programs, n, in_place, vals)
        stuck, _ = walk(programs, ex.run, ordered_deps(programs, in_place))
        if stuck:
            return False
        mems.append([{j: ex.mem[r].get(ex.keys[r](Buf.OUTPUT, j))
                      for j in range(p.buffer_chunks(Buf.OUTPUT))}
                     for r, p in enumerate(programs[:n])])
    return mems[0] == mems[1]
