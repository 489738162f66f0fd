"""The planner: from a validated call (:class:`CallSpec`) to a call ready to run.

It owns every decision between the API and the executor:

- *algorithm*: the caller's ``algo=``, else the tuner (:mod:`ringtree.tuning.tuner`) on the
  call's size, cached per (collective, bytes);
- *protocol*: a plan is a Program × a protocol. :meth:`Planner._protocol` has the tuner
  price (algorithm, protocol) pairs (:func:`ringtree.tuning.proto.choose_protocol`): the
  Simple algorithms, run by the executor, and the Program the LL runner serves for the
  collective (:mod:`ringtree.runtime.protocols`). An LL plan carries that Program and
  the op the runner prepared from it (and, built when first needed, its Simple twin
  for calls inside a ``group()``); every plan on a single-host communicator the header
  it announces in the LL segment when it runs on Simple;
- *hot path*: :attr:`Planner.ready` gives an in-place NumPy all-reduce whose shape was
  planned on LL its prepared op with one dictionary look-up (:attr:`Planner.ready_blocks`
  the same for an all-gather or reduce-scatter into a separate NumPy ``out``, a broadcast,
  a reduce);
- *fallbacks*: an algorithm that cannot run in place gets a private copy of the input;
  PREMUL_SUM reduces a pre-scaled copy (the user's input is never changed);
- *scratch*: a plan keeps its scratch and staging buffers and lends them to one call at a
  time (a second call in flight on the same plan gets fresh ones);
- *caches*: a :class:`Plan` per call shape. A call that repeats the previous call's shape
  (collective, count, dtype, op, root, in-place, algorithm) gets the same plan back after
  one tuple comparison, with no Program generated or compiled.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ringtree.dtypes import DType
from ringtree.ir.program import Buf, Collective, Program, Step, inp, out, split_even
from ringtree.ir.wire import P2P_CODE, PROTO_SIMPLE, WireHeader, algo_code
from ringtree.ops import ReduceOp, premul_sum
from ringtree.runtime import imported, protocols
from ringtree.runtime.callspec import _COPY, _PREMUL, SHAPE_FIELDS, CallSpec, Plan
from ringtree.runtime.plan import CStep, Region, compile_program
from ringtree.runtime.protocols.ll_entry import BARRIER
from ringtree.schedules import Options, algorithms, build, needs_switch, options_for, record
from ringtree.transports import registry as transport_registry
from ringtree.tuning.proto import LL, SIMPLE, choose_protocol
from ringtree.tuning.tuner import MODELS, choose, tuned

P2P_CHANNEL_BASE = 64   # send/recv with tag t run on channel P2P_CHANNEL_BASE + t
__all__ = ["BLOCK_HOT", "P2P_CHANNEL_BASE", "SHAPE_FIELDS", "CallSpec", "Plan", "Planner",
           "link_kind"]

BLOCK_HOT = frozenset({Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.BROADCAST})


def link_kind(nodes: tuple[int, ...], transport: str) -> str:
    """The cost model every rank agrees on: the host's transport when the whole job is on
    one host (shm unless ``RINGTREE_TRANSPORT`` names another; crowded when ranks
    outnumber its cores), else the network's (:func:`ringtree.transports.registry.link_kind`)."""
    return transport_registry.link_kind(nodes, transport)


class Planner:
    """Chooses algorithms and builds plans for one rank of a communicator."""

    def __init__(self, rank: int, size: int, nodes: tuple[int, ...], *, nchannels: int,
                 slice_bytes: int, algo_enabled: dict, link: str, transport: str = "auto",
                 debug: str = ""):
        self.rank, self.size, self.nodes = rank, size, nodes
        self.nchannels, self.slice_bytes = nchannels, slice_bytes
        self.algo_enabled, self.link = algo_enabled, link
        self.transport, self.debug = transport, debug
        self.collnet: Any = None   # ringtree.switch.collnet.CollNet, set by the communicator
        self.topology: Any = None  # ringtree.tuning.links.Topology when ranks span hosts
        self._plans: dict[tuple, Plan] = {}
        self._choices: dict[tuple[Collective, int], tuple[str, str]] = {}  # (model, used)
        self.online: Any = None    # ringtree.tuning.autotune.OnlineChoice, or None
        self._last: Plan | None = None
        self.ll = None                      # the communicator's LLRunner, if any
        self.proto_enabled: dict = {}       # RINGTREE_PROTO per collective
        # the hot path: (dtype, size, ReduceOp) -> (LLOp, Reducer) of the in-place NumPy
        # all-reduces planned on LL; read by Communicator.all_reduce (see _remember_ready)
        self.ready: dict[tuple, tuple] = {}
        self.ready_blocks: dict[tuple, tuple] = {}

    def relayout(self, nodes: tuple[int, ...]) -> None:
        """Plan for the node layout ``nodes`` from now on, forgetting the plans and
        algorithm choices made for the old one (tests fake multi-host layouts on one)."""
        self.nodes = nodes
        self._plans.clear()
        self._choices.clear()
        self.ready.clear()
        self.ready_blocks.clear()
        self._last = None

    def plan(self, spec: CallSpec, grouped: bool = False) -> Plan:
        """The plan for ``spec``'s shape: the previous call's if the shape repeats.
        ``grouped``: the call is inside a ``group()``, which runs on Simple."""
        last = self._last
        if last is not None and last.key == spec[:SHAPE_FIELDS] and \
                (last.ll_op is None or not grouped):
            return last
        key = spec[:SHAPE_FIELDS]
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) > 512:
                self._plans.clear()
                self.ready.clear()
                self.ready_blocks.clear()
            plan = self._plans[key] = self._build(spec, key)
            if self.debug in ("INFO", "TRACE") and self.rank == 0 and len(self._plans) < 64:
                print(f"ringtree: plan {plan.name}(count={spec.count}, {spec.dtype.value}): "
                      f"algo={plan.algo} proto={'LL' if plan.ll_op is not None else 'Simple'}",
                      flush=True)
        self._last = plan
        if grouped and plan.ll_op is not None:
            if plan.simple is None:
                plan.simple = self._build(spec, key, simple=True)
            return plan.simple
        return plan

    def _remember_ready(self, spec: CallSpec, plan: Plan) -> None:
        """Give :attr:`ready` a NumPy all-reduce planned on LL, :attr:`ready_blocks` a
        barrier, an all-gather or reduce-scatter into a NumPy ``out`` (apart, or in place:
        ``x`` the all-gather's own block, ``out`` the reduce-scatter's), a broadcast in
        place, or a reduce (not bfloat16, whose storage is not its dtype, nor a user op).
        PREMUL_SUM's key is the caller's op, ``premul_sum(scalar)``, but for a scalar of 0
        (equal to -0.0, whose products differ) or NaN."""
        x, op, coll, red = spec.result, spec.op, spec.coll, spec.reducer
        if coll is Collective.BARRIER:  # LLRunner.barrier_now (no buffers)
            self.ready_blocks[BARRIER] = (plan.ll_op, red)
            return
        if coll is Collective.REDUCE:  # every rank (a non-root's result is None)
            x = spec.inp
        if type(x) is not np.ndarray or spec.dtype is DType.BFLOAT16 or \
                red is not None and red.user is not None:
            return
        if op is ReduceOp.PREMUL_SUM:
            if red is None or not red.scalar or red.scalar != red.scalar:
                return
            op = premul_sum(red.scalar)
        if coll is Collective.ALL_REDUCE:
            self.ready[(x.dtype, x.size, op, spec.in_place)] = (plan.ll_op, red)
        elif coll is Collective.REDUCE:  # key: (REDUCE, dtype, count, op, root, in place)
            self.ready_blocks[(coll, x.dtype, spec.count, op, spec.root, spec.in_place)] = \
                (plan.ll_op, red)
        elif coll in BLOCK_HOT and (spec.in_place or coll is not Collective.BROADCAST) and \
                spec.post is None:  # key: (coll, dtype, count, op, or root if op is None)
            self.ready_blocks[(coll, x.dtype, spec.count, op or spec.root)] = (plan.ll_op, red)

    def choose(self, coll: Collective, nbytes: int, algo: str | None = None,
               spec: CallSpec | None = None) -> str:
        """The algorithm for a call of ``nbytes`` (the caller's ``algo`` if given).

        The model's choice, or where the model cannot tell its best candidates apart and
        ``online`` is set (:mod:`ringtree.tuning.autotune`), the one measured fastest on the
        communicator at the first such call (``spec``: the call, whose shape the
        measurement copies). A reduction of another shape uses the measured winner only
        where it gives the model's choice's bits for that shape too."""
        if algo is not None:
            return algo.lower()
        key = (coll, nbytes)
        cached = self._choices.get(key)
        if cached is None:
            opts = self._base()
            model = self.model()
            enabled = self.algo_enabled.get(coll)
            if self.collnet is None:  # CollNet only where a switch was set up, as NCCL
                enabled = {a for a in (enabled or tuned(coll))
                           if not needs_switch(coll, a)}
            first = choose(coll, nbytes, self.size, enabled, model, opts)
            if self.collnet is not None and needs_switch(coll, first):
                first = self.collnet.prefer(coll, nbytes, self.size, enabled, model, opts)
            ranked = None
            if self.debug in ("INFO", "TRACE") and self.rank == 0 and len(self._choices) < 64:
                from ringtree.tuning.tuner import ranking

                ranked = ranking(coll, nbytes, self.size, enabled, model, opts)
                rank_text = ", ".join(f"{a} {t * 1e6:,.0f}" for a, t in ranked[:4])
                print(f"ringtree: {coll.value} {nbytes} B: chose {first}; predicted us: "
                      f"{rank_text}", flush=True)
            chosen = first
            if self.online is not None and spec is None:
                return first  # nothing to measure with: ask again at the call itself
            if self.online is not None and spec is not None:
                if ranked is None:
                    from ringtree.tuning.tuner import ranking

                    ranked = ranking(coll, nbytes, self.size, enabled, model, opts)
                chosen = self.online.decide(spec, nbytes, first, ranked,
                                            self._base(spec.root))
            if len(self._choices) > 4096:
                self._choices.clear()
            cached = self._choices[key] = (first, chosen)
        first, chosen = cached
        if chosen != first and spec is not None and self.online is not None and \
                not self.online.same_bits(spec, first, chosen, self._base(spec.root), nbytes):
            return first
        return chosen

    def model(self):
        """The tuner's cost model: per link class when ranks span hosts."""
        if self.topology is None:
            return MODELS[self.link]
        from ringtree.tuning.tuner import host_model

        host = transport_registry.on_host(self.transport)
        return host_model(self.topology,
                          MODELS[transport_registry.model_key(host, self.topology.crowded)])

    def _base(self, root: int = 0) -> Options:
        """The options every algorithm is refined from for a call (root, channels, node
        layout); each algorithm's record adds its own per size
        (:func:`ringtree.schedules.build`, and the tuner per candidate)."""
        return Options(root=max(root, 0), channels=self.nchannels, nodes=self.nodes)

    def _options(self, coll: Collective, nbytes: int, root: int = 0) -> Options:
        """The base options with the per-size params every algorithm of ``coll`` adds
        for ``nbytes`` (each reads only its own, so refining these per algorithm gives
        the same options as refining the base): a call's pieces at a glance."""
        opts = self._base(root)
        for algo in algorithms(coll):
            opts = options_for(coll, algo, nbytes, opts)
        return opts

    def _slices(self) -> int:
        """Slice bytes of a collective's plan. With one rank per host every step crosses
        the network and forwards a slice only once it has arrived whole, so a slice of
        about a millisecond of the link (a power of two, at least 64 KiB, at most
        ``RINGTREE_BUFFSIZE``/4) keeps each hop's link busy while the next is reduced;
        otherwise ``RINGTREE_BUFFSIZE``/4."""
        t = self.topology
        if t is None or t.hosts != self.size:
            return self.slice_bytes
        return min(self.slice_bytes, 1 << max(16, (int(t.bandwidth * 1e-3) - 1).bit_length()))

    def program(self, coll: Collective, algo: str, root: int, nbytes: int = 0) -> Program:
        """This rank's Program for a call of ``nbytes`` with ``algo``: the one
        :func:`ringtree.schedules.build` gives for the planner's base options (what the
        simulator runs too)."""
        prog = build(coll, algo, self.size, self.rank, nbytes, self._base(root))
        if self.collnet is not None and prog.meta.get("virtual_programs"):
            self.collnet.ensure(prog)  # join the switch groups this rank talks to
        return prog

    def _collnet_algo(self, spec: CallSpec, algo: str, nbytes: int) -> str:
        """``algo`` if the switch can serve this call; else a clear error when the caller
        asked for CollNet, or the best host algorithm when the tuner did (the switch
        reduces SUM, MIN and MAX on SHARP's dtypes only: never a wrong answer)."""
        from ringtree.switch.wire import check_call

        if record(spec.coll, algo).switch == "nvlink":
            raise ValueError(f"{algo} reduces inside an NVLink switch (NVLS): ringtree "
                             "sim models it, the executor cannot run it")
        nnodes = len(set(self.nodes))
        if nnodes < 2:
            return algo  # one host: the schedule never reaches a switch
        if self.collnet is None:
            raise ValueError(f"{algo} runs on an in-network aggregation switch: set "
                             "RINGTREE_COLLNET_ENABLE=1 and RINGTREE_COLLNET_SWITCH=ADDR:PORT")
        red = spec.reducer
        op = None if red is None or red.user is not None else red.op
        members = nnodes
        if spec.coll in (Collective.BROADCAST, Collective.ALL_GATHER, Collective.REDUCE_SCATTER):
            members = self.size  # every rank is a member (ringtree.schedules.collnet_mc)
            if spec.coll is not Collective.REDUCE_SCATTER:
                op = ReduceOp.SUM  # a multicast reduces nothing
        why = check_call(op, spec.dtype, nbytes, members)
        if why is None:
            return algo
        if spec.algo is not None:
            raise ValueError(f"{algo}: {why}")
        coll = spec.coll
        assert coll is not None
        host = {a for a in (self.algo_enabled.get(coll) or tuned(coll))
                if not needs_switch(coll, a)}
        return choose(coll, nbytes, self.size, host, self.model(), self._base())

    # ---- building -------------------------------------------------------------------------

    def _build(self, spec: CallSpec, key: tuple, simple: bool = False) -> Plan:
        if spec.coll is None:
            return self._p2p(spec, key)
        coll, count, itemsize = spec.coll, spec.count, spec.dtype.itemsize
        if spec.blocks is not None:
            in_blocks, out_blocks = spec.blocks
        else:
            nin, nout = coll.blocks(self.size)
            in_blocks, out_blocks = (count,) * nin, (count,) * nout
        nbytes = count * itemsize * max(len(in_blocks), len(out_blocks), 1)
        algo = imported.from_folders(spec, self.size, nbytes) if spec.algo is None else None
        algo = algo or self.choose(coll, nbytes, spec.algo, spec)
        if needs_switch(coll, algo):
            algo = self._collnet_algo(spec, algo, nbytes)
        msccl = algo.startswith(imported.PREFIX)
        protocol = SIMPLE if simple or msccl else self._protocol(spec, nbytes)
        if protocol == LL:
            return self._build_ll(spec, key, nbytes)
        prog = self.program(coll, algo, spec.root, nbytes)
        imported.rules(prog, spec.in_place, count)
        if msccl and not simple:
            rounds = self._build_rounds(spec, key, prog, nbytes)
            if rounds is not None:
                return rounds
        stage, in_place = 0, spec.in_place
        if spec.op is ReduceOp.PREMUL_SUM and spec.inp is not None:
            stage, in_place = _PREMUL, False  # reduce a scaled copy, never the input
        elif in_place and not prog.in_place_ok:
            stage, in_place = _COPY, False    # the algorithm needs input and output apart
        steps = compile_program(prog, list(in_blocks), list(out_blocks), count, itemsize,
                                self._slices(), in_place)
        avg = spec.op is ReduceOp.AVG and (coll is not Collective.REDUCE
                                           or self.rank == spec.root)
        plan = Plan(key, algo, steps, name=coll.value, coll_code=coll.code, root=spec.root,
                    stage=stage, scratch_len=prog.blocks(Buf.SCRATCH) * count if prog.scratch
                    else 0, scratch_fill=1 if coll is Collective.BARRIER else None, avg=avg)
        plan.program = prog
        if self.ll is not None:
            code = spec.reducer.code if spec.reducer is not None else 0
            plan.announce = WireHeader(0, count, 0, algo_code(algo), coll.code,
                                       spec.dtype.code, code, PROTO_SIMPLE,
                                       spec.root).call_words()
        return plan

    def _build_ll(self, spec: CallSpec, key: tuple, nbytes: int) -> Plan:
        """The LL plan: the Program the LL runner serves for the collective (one channel)
        and the op it prepares from it."""
        coll = spec.coll
        assert coll is not None
        prog = self.ll_program(coll, spec.root, nbytes)
        code = spec.reducer.code if spec.reducer is not None else 0
        plan = Plan(key, prog.algo, [], name=coll.value, coll_code=coll.code, root=spec.root,
                    protocol=LL)
        plan.program = prog
        plan.ll_op = self.ll.prepare(prog, spec.dtype, spec.count, code, spec.root)
        self._remember_ready(spec, plan)
        return plan

    def ll_program(self, coll: Collective, root: int, nbytes: int) -> Program:
        """The one-round Program the LL runner serves ``coll`` with."""
        algo = protocols.algorithm(LL, coll)
        assert algo is not None
        return build(coll, algo, self.size, self.rank, nbytes,
                     Options(root=max(root, 0), channels=1, nodes=self.nodes))

    def _build_rounds(self, spec: CallSpec, key: tuple, prog: Program, nbytes: int
                      ) -> Plan | None:
        """An imported file written for LL on LL (:func:`imported.rounds_op`), or None."""
        op = imported.rounds_op(self, spec, prog, nbytes)
        if op is None:
            return None
        assert spec.coll is not None
        plan = Plan(key, prog.algo, [], name=spec.coll.value, coll_code=spec.coll.code,
                    root=spec.root, protocol=LL)
        plan.program, plan.ll_op = prog, op
        return plan

    def _protocol(self, spec: CallSpec, nbytes: int) -> str:
        """LL (one host, no algorithm named, LL serves the collective) where LL serves the
        call at any size (its single-copy path, or an all-gather measured faster streamed
        through the segment: ``LLRunner.serves_any_size``) or the communicator has one
        rank (its LL op copies at most, in one C entry), else the cheaper (algorithm,
        protocol) pair (choose_protocol)."""
        ll, coll = self.ll, spec.coll
        if ll is None or coll is None or spec.algo is not None or spec.blocks is not None \
                or protocols.algorithm(LL, coll) is None:
            return SIMPLE
        if LL in self.proto_enabled.get(coll, ()) and (
                ll.serves_any_size(spec) or
                self.size == 1 and ll.fits(coll, spec.count, spec.dtype.itemsize)):
            return LL  # one copy (protocols/ll_direct.py), or a measured streamed gather
        return choose_protocol(coll, nbytes, self.size, self.proto_enabled.get(coll),
                               ll.fits(coll, spec.count, spec.dtype.itemsize), self.model(),
                               self.algo_enabled.get(coll))

    def _p2p(self, spec: CallSpec, key: tuple) -> Plan:
        sending, n = spec.algo == "send", spec.count
        region = Region(int(Buf.INPUT if sending else Buf.OUTPUT), 0, n)
        slice_elems = max(1, self.slice_bytes // spec.dtype.itemsize)
        nsl = -(-n // slice_elems) if n else 0
        slices = tuple(split_even(n, nsl, k) for k in range(nsl))
        if sending:
            cs = CStep(0, Step(src=inp(0), send_to=(spec.root,)), region, None, n, slices, ())
        else:
            cs = CStep(0, Step(dst=out(0), recv_from=(spec.root,)), None, region, n, slices,
                       ())
        return Plan(key, "p2p", [[cs]], name="send" if sending else "recv",
                    coll_code=P2P_CODE, root=spec.tag, channel_base=P2P_CHANNEL_BASE + spec.tag)
