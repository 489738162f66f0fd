"""An MSCCL-IR algorithm as data, checked the way the executors' loader checks it, and
further (what would make it hang or compute garbage).

The element tree (``algo`` › ``gpu`` › ``tb`` › ``step``), its attributes and the limits
are those of NCCL's MSCCL executor and RCCL (``msccl_parser.cc``, ``msccl_struct.h``) and
of the first MSCCL runtime (``src/graph/topo.cc``); where they differ, the finding says
which one refuses what:

- a *thread block* (``tb``) runs its steps in order; it sends to at most one peer and
  receives from at most one, over NCCL channel ``chan``, so the connection (sender,
  receiver, channel) carries one block's messages in program order;
- a step names a source and a destination (buffer ``i``, ``o`` or ``s`` and a chunk
  offset), ``cnt`` consecutive chunks, and at most one dependency: step ``deps`` of block
  ``depid`` on the same GPU, which must publish its completion (``hasdep="1"``); further
  dependencies are ``nop`` steps placed before it;
- chunk geometry: a buffer is cut into ``nchunksperloop`` chunks of the collective's
  whole buffer (all-gather's output, reduce-scatter's input), so all-reduce and
  all-to-all have that many chunks in both buffers, all-gather's input and
  reduce-scatter's output ``nchunksperloop / ngpus``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringtree.ir.collectives import Collective
from ringtree.msccl.xml import Finding, Node

PROTOCOLS = ("Simple", "LL", "LL128")
# The executors' names (msccl_parser.cc) and the first runtime's (topo.cc) of what
# ringtree runs; ``reduce_scatter`` is the first runtime's spelling only.
COLLECTIVES = {"allreduce": Collective.ALL_REDUCE, "allgather": Collective.ALL_GATHER,
               "reducescatter": Collective.REDUCE_SCATTER,
               "reduce_scatter": Collective.REDUCE_SCATTER,
               "alltoall": Collective.ALL_TO_ALL, "broadcast": Collective.BROADCAST,
               "reduce": Collective.REDUCE, "gather": Collective.GATHER,
               "scatter": Collective.SCATTER}
EXECUTOR_NAMES = {Collective.ALL_REDUCE: "allreduce", Collective.ALL_GATHER: "allgather",
                  Collective.REDUCE_SCATTER: "reducescatter",
                  Collective.ALL_TO_ALL: "alltoall", Collective.BROADCAST: "broadcast",
                  Collective.REDUCE: "reduce", Collective.GATHER: "gather",
                  Collective.SCATTER: "scatter"}
# step types: what each reads and writes (src, dst), whether it sends / receives
STEP_TYPES = {"s": (True, False, True, False), "r": (False, True, False, True),
              "rcs": (False, True, True, True), "rrs": (True, False, True, True),
              "rrc": (True, True, False, True), "rrcs": (True, True, True, True),
              "re": (True, True, False, False), "cpy": (True, True, False, False),
              "nop": (False, False, False, False), "ra": (True, True, False, False)}
BUFFERS = ("i", "o", "s")
# executor / RCCL limits (msccl_struct.h): steps per block, blocks per GPU and per
# channel, chunks per step, the largest depid (an int8_t)
MAX_STEPS, MAX_BLOCKS, MAX_BLOCKS_PER_CHANNEL, MAX_CNT, MAX_DEPID = 64, 64, 32, 72, 127
ALGO_REQUIRED = ("proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace")
ALGO_EXECUTOR = ("outofplace", "minBytes", "maxBytes")
GPU_REQUIRED = ("id", "i_chunks", "o_chunks", "s_chunks")
TB_REQUIRED = ("id", "send", "recv", "chan")
STEP_REQUIRED = ("s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps",
                 "hasdep")


@dataclass(frozen=True)
class MStep:
    """One ``step``: what it does, on which chunks, after what."""

    s: int
    type: str
    srcbuf: str
    srcoff: int
    dstbuf: str
    dstoff: int
    cnt: int
    depid: int = -1
    deps: int = -1
    hasdep: int = 0


@dataclass(frozen=True)
class ThreadBlock:
    """A ``tb``: steps run in order, sending to ``send`` and receiving from ``recv``
    (-1: none) over NCCL channel ``chan``."""

    id: int
    send: int
    recv: int
    chan: int
    steps: tuple[MStep, ...]


@dataclass(frozen=True)
class Gpu:
    """A ``gpu``: its thread blocks, and its buffers' sizes in chunks as the file gives
    them (the executors read only ``s_chunks``; see :meth:`Algorithm.buffer_chunks`)."""

    id: int
    i_chunks: int
    o_chunks: int
    s_chunks: int
    tbs: tuple[ThreadBlock, ...]


@dataclass(frozen=True)
class Algorithm:
    """One MSCCL-IR file: one collective on ``ngpus`` ranks, one protocol. ``coll`` is the
    name as written, ``collective`` what it means; ``outofplace``, ``min_bytes`` and
    ``max_bytes`` are None where the file does not say (the first runtime's files)."""

    name: str
    proto: str
    nchannels: int
    nchunksperloop: int
    ngpus: int
    coll: str
    inplace: bool
    outofplace: bool | None
    min_bytes: int | None
    max_bytes: int | None
    gpus: tuple[Gpu, ...]

    @property
    def collective(self) -> Collective:
        return COLLECTIVES[self.coll]

    def buffer_chunks(self, buf: str, gpu: Gpu) -> int:
        """Chunks of buffer ``buf`` on ``gpu``: the collective's geometry for ``i``/``o``
        (see the module docstring), the file's ``s_chunks`` for scratch."""
        if buf == "s":
            return gpu.s_chunks
        whole, per = self.nchunksperloop, self.nchunksperloop // max(self.ngpus, 1)
        c = self.collective
        if c is Collective.ALL_GATHER or c is Collective.GATHER:
            return per if buf == "i" else whole
        if c is Collective.REDUCE_SCATTER or c is Collective.SCATTER:
            return whole if buf == "i" else per
        return whole


class _Reader:
    """Builds the :class:`Algorithm` of a parsed tree, noting what is wrong."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.findings: list[Finding] = []

    def note(self, level: str, node: Node, what: str, inside: str = "") -> None:
        where = f"{self.path}:{node.line}" + (f" ({inside})" if inside else "")
        self.findings.append(Finding(level, where, what))

    def ints(self, node: Node, names: tuple[str, ...], inside: str = "",
             level: str = "error") -> dict[str, int | None]:
        out: dict[str, int | None] = {}
        for k in names:
            v = node.attrs.get(k)
            if v is None:
                self.note(level, node, f"<{node.name}> has no attribute {k!r}", inside)
                out[k] = None
                continue
            try:
                out[k] = int(v)
            except ValueError:
                self.note("error", node, f"<{node.name}> {k}={v!r} is not an integer", inside)
                out[k] = None
        return out

    def algorithm(self, root: Node) -> Algorithm | None:
        if root.name != "algo":
            self.note("error", root, f"the root element is <{root.name}>, not <algo>")
            return None
        a = root.attrs
        for k in ALGO_REQUIRED + ALGO_EXECUTOR:
            if k not in a:
                self.note("error" if k in ALGO_REQUIRED else "executor", root,
                          f"<algo> has no attribute {k!r}" + (
                              "" if k in ALGO_REQUIRED else
                              " (NCCL's MSCCL executor and RCCL require it)"))
        nums = self.ints(root, ("nchannels", "nchunksperloop", "ngpus"))
        flags = self.ints(root, ("inplace",))
        extra = {k: int(a[k]) if k in a and a[k].lstrip("-").isdigit() else None
                 for k in ("outofplace", "minBytes", "maxBytes")}
        if a.get("proto") not in PROTOCOLS:
            self.note("error", root, f"proto={a.get('proto')!r}: the executors know "
                                     f"{', '.join(PROTOCOLS)}")
        coll = a.get("coll", "")
        if coll not in COLLECTIVES:
            self.note("error", root, f"coll={coll!r}: not a collective ringtree runs "
                                     f"(known: {', '.join(sorted(COLLECTIVES))})")
        elif coll == "reduce_scatter":
            self.note("executor", root, "coll='reduce_scatter' is the first MSCCL runtime's "
                                        "spelling; NCCL's MSCCL executor and RCCL read "
                                        "'reducescatter'")
        if None in nums.values() or None in flags.values() or coll not in COLLECTIVES or \
                a.get("proto") not in PROTOCOLS:
            return None
        n, chunks = nums["ngpus"] or 0, nums["nchunksperloop"] or 0
        if n < 1 or chunks < 1 or (nums["nchannels"] or 0) < 1:
            self.note("error", root, "ngpus, nchunksperloop and nchannels must be positive")
            return None
        algo = Algorithm(a.get("name", ""), a["proto"], nums["nchannels"] or 0, chunks, n,
                         coll, bool(flags["inplace"]),
                         None if extra["outofplace"] is None else bool(extra["outofplace"]),
                         extra["minBytes"], extra["maxBytes"], ())
        gpus = [g for g in (self.gpu(algo, node) for node in root.children
                            if node.name == "gpu") if g is not None]
        ids = sorted(g.id for g in gpus)
        if ids != list(range(n)):
            self.note("error", root, f"the <gpu> ids are {ids}, not 0..{n - 1}")
        return Algorithm(**{**algo.__dict__, "gpus": tuple(sorted(gpus, key=lambda g: g.id))})

    def gpu(self, algo: Algorithm, node: Node) -> Gpu | None:
        v = self.ints(node, GPU_REQUIRED)
        if None in v.values():
            return None
        g = Gpu(v["id"] or 0, v["i_chunks"] or 0, v["o_chunks"] or 0, v["s_chunks"] or 0, ())
        inside = f"gpu {g.id}"
        tbs = [t for t in (self.block(algo, g, c) for c in node.children if c.name == "tb")
               if t is not None]
        ids = sorted(t.id for t in tbs)
        if ids != list(range(len(ids))):
            self.note("error", node, f"thread block ids {ids} are not 0..{len(ids) - 1} "
                                     "(the executors: 'thread block is missing')", inside)
        if len(tbs) > MAX_BLOCKS:
            self.note("executor", node, f"{len(tbs)} thread blocks (RCCL runs at most "
                                        f"{MAX_BLOCKS} per GPU)", inside)
        g = Gpu(g.id, g.i_chunks, g.o_chunks, g.s_chunks, tuple(sorted(tbs, key=lambda t: t.id)))
        self.geometry(algo, g, node, inside)
        lines = {t.id: c for t, c in zip(tbs, (c for c in node.children if c.name == "tb"))}
        self.connections(g, lines)
        for tb in g.tbs:
            for st in tb.steps:
                self.check_step(algo, g, tb, st, lines[tb.id])
        return g

    def connections(self, g: Gpu, lines: dict[int, Node]) -> None:
        """One block per (peer, channel) and direction: a connection's messages must come
        from one block in program order."""
        seen: dict[tuple, int] = {}
        for tb in g.tbs:
            for role, peer in (("send", tb.send), ("recv", tb.recv)):
                if peer < 0:
                    continue
                other = seen.setdefault((role, peer, tb.chan), tb.id)
                if other != tb.id:
                    self.note("error", lines[tb.id], f"thread blocks {other} and {tb.id} "
                              f"both {role} {'to' if role == 'send' else 'from'} GPU {peer} "
                              f"on channel {tb.chan}: one connection, two message orders",
                              f"gpu {g.id} tb {tb.id}")

    def check_step(self, algo: Algorithm, g: Gpu, tb: ThreadBlock, st: MStep,
                   node: Node) -> None:
        """Chunks inside their buffers, peers where the type needs them, dependencies
        that can be met."""
        inside = f"gpu {g.id} tb {tb.id} step {st.s}"
        reads, writes, sends, recvs = STEP_TYPES[st.type]
        if sends and tb.send < 0:
            self.note("error", node, f"a {st.type!r} step in a block with send=-1", inside)
        if recvs and tb.recv < 0:
            self.note("error", node, f"a {st.type!r} step in a block with recv=-1", inside)
        if st.type != "nop" and st.cnt < 1:
            self.note("error", node, f"cnt={st.cnt}: a {st.type!r} step moves no chunk",
                      inside)
        for used, role, buf, off in ((reads, "src", st.srcbuf, st.srcoff),
                                     (writes, "dst", st.dstbuf, st.dstoff)):
            if not used:
                continue
            if buf not in BUFFERS:
                self.note("error", node, f"{role}buf={buf!r} is not i, o or s", inside)
                continue
            size = algo.buffer_chunks(buf, g)
            if not 0 <= off or off + st.cnt > size:
                self.note("error", node, f"{role} chunks {off}..{off + st.cnt - 1} of buffer "
                          f"{buf!r}, which has {size}", inside)
        if st.depid < 0:
            return
        target = next((t for t in g.tbs if t.id == st.depid), None)
        if target is None or target.id == tb.id:
            self.note("error", node, f"depid={st.depid} is not another thread block of "
                                     f"gpu {g.id}", inside)
        elif not 0 <= st.deps < len(target.steps):
            self.note("error", node, f"deps={st.deps}: block {st.depid} has "
                                     f"{len(target.steps)} steps", inside)
        elif not any(x.hasdep for x in target.steps[st.deps:]):
            self.note("error", node, f"waits for step {st.deps} of block {st.depid}, which "
                      "never publishes its completion (hasdep=0 from there on): it would "
                      "wait forever", inside)

    def geometry(self, algo: Algorithm, g: Gpu, node: Node, inside: str) -> None:
        for buf, have in (("i", g.i_chunks), ("o", g.o_chunks)):
            want = algo.buffer_chunks(buf, g)
            if have not in (0, want):
                self.note("executor", node, f"{buf}_chunks={have}, but {algo.coll} with "
                          f"nchunksperloop={algo.nchunksperloop} on {algo.ngpus} GPUs has "
                          f"{want} (the first MSCCL runtime refuses this)", inside)

    def block(self, algo: Algorithm, g: Gpu, node: Node) -> ThreadBlock | None:
        inside = f"gpu {g.id}"
        v = self.ints(node, TB_REQUIRED, inside)
        if None in v.values():
            return None
        tb_id, send, recv, chan = (v[k] or 0 for k in TB_REQUIRED)
        inside = f"gpu {g.id} tb {tb_id}"
        for role, peer in (("send", send), ("recv", recv)):
            if not -1 <= peer < algo.ngpus or peer == g.id:
                self.note("error", node, f"{role}={peer} is not another GPU of "
                                         f"0..{algo.ngpus - 1}", inside)
        if not 0 <= chan < algo.nchannels:
            self.note("error", node, f"chan={chan} is outside nchannels={algo.nchannels}",
                      inside)
        steps = []
        for k, child in enumerate(c for c in node.children if c.name == "step"):
            st = self.step(algo, child, f"{inside} step {k}", k)
            if st is not None:
                steps.append(st)
        if len(steps) > MAX_STEPS:
            self.note("executor", node, f"{len(steps)} steps (the executors run at most "
                                        f"{MAX_STEPS} per thread block)", inside)
        return ThreadBlock(tb_id, send, recv, chan, tuple(steps))

    def step(self, algo: Algorithm, node: Node, inside: str, k: int) -> MStep | None:
        a = node.attrs
        v = self.ints(node, ("s", "srcoff", "dstoff", "cnt", "depid", "deps", "hasdep"),
                      inside)
        if None in v.values() or any(x not in a for x in STEP_REQUIRED):
            for x in ("type", "srcbuf", "dstbuf"):
                if x not in a:
                    self.note("error", node, f"<step> has no attribute {x!r}", inside)
            return None
        if a["type"] not in STEP_TYPES:
            self.note("error", node, f"type={a['type']!r} is not an MSCCL step type "
                                     f"({' '.join(STEP_TYPES)})", inside)
            return None
        if a["type"] == "ra":
            self.note("executor", node, "type='ra' (residual add) runs only on the first "
                                        "MSCCL runtime", inside)
        if v["s"] != k:
            self.note("executor", node, f"s={v['s']} at position {k}: dependencies and "
                                        "completion flags count positions", inside)
        if (v["cnt"] or 0) >= MAX_CNT:
            self.note("executor", node, f"cnt={v['cnt']} (the executors take fewer than "
                                        f"{MAX_CNT})", inside)
        if (v["depid"] or 0) > MAX_DEPID:
            self.note("executor", node, f"depid={v['depid']} (the executor stores it in "
                                        f"8 bits: at most {MAX_DEPID})", inside)
        if v["hasdep"] not in (0, 1):
            self.note("error", node, f"hasdep={v['hasdep']} must be 0 or 1", inside)
        return MStep(k, a["type"], a["srcbuf"], v["srcoff"] or 0, a["dstbuf"],
                     v["dstoff"] or 0, v["cnt"] or 0, v["depid"] if v["depid"] is not None
                     else -1, v["deps"] if v["deps"] is not None else -1, v["hasdep"] or 0)


def from_tree(root: Node, path: str) -> tuple[Algorithm | None, list[Finding]]:
    """The algorithm of a parsed file (None if it cannot be built) and what is wrong."""
    reader = _Reader(path)
    algo = reader.algorithm(root)
    return algo, reader.findings
