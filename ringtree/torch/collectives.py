"""The operations of :class:`~ringtree.torch.backend.RingtreeProcessGroup`: every method
``torch.distributed`` dispatches to a process group, under torch 2.13's names and the
older ones (``_allgather_base``, ``_reduce_scatter_base``, ``alltoall_base``,
``allgather_into_tensor_coalesced``, ``reduce_scatter_tensor_coalesced``).

Each method stages its tensors (:mod:`ringtree.torch.tensors`: zero-copy when possible),
issues the ringtree operation(s) asynchronously through ``_launch`` and returns the
:class:`~ringtree.torch.work.RingtreeWork` whose future resolves to the output tensors.
Options objects are torch's (``AllreduceOptions`` ...); ``opts.timeout``, when set,
overrides the group's timeout for that operation.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from ringtree.runtime.planner import P2P_CHANNEL_BASE
from ringtree.torch.monitored import monitored_barrier
from ringtree.torch.sparse import all_reduce_coo, check_sparse
from ringtree.torch.tensors import Staged, as_numpy, for_move, for_reduce, run_all
from ringtree.torch.work import RingtreeWork


def _one(tensors: Sequence[torch.Tensor], what: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise ValueError(f"ringtree {what}: expected one tensor per call (CPU), got "
                         f"{len(tensors)}")
    return tensors[0]


def _splits(splits: Sequence[int], rows: int, n: int, what: str) -> list[int]:
    if splits:
        return [int(s) for s in splits]
    if rows % n:
        raise ValueError(f"all_to_all_single: {what} dim 0 ({rows}) is not divisible by "
                         f"{n} ranks and no split sizes were given")
    return [rows // n] * n


def _rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` (a staged view) as a 2-D (rows, width) view, so splits count rows."""
    width = t.numel() // rows if rows else 0
    return t.reshape(rows, width)


class CollectiveOps:
    """Mixed into RingtreeProcessGroup, which provides ``comm``, ``engine``, ``timeout``,
    ``_lock``, ``_tmo``, ``_launch``, ``_when_all``, ``_finish`` and ``_dispatch``."""

    # ---- collectives ---------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceOptions()
        t = _one(tensors, "allreduce")
        tmo = self._tmo(opts)
        if t.is_sparse:
            return self._sparse_allreduce(t, opts.reduceOp, tmo, tensors)
        st, op = for_reduce(t, opts.reduceOp)
        if self._blocking(opts):  # as a NumPy array: the communicator's hot path
            x = as_numpy(st.obj)
            return self._now("allreduce", tensors, lambda: self.comm.all_reduce(
                x, op, timeout=tmo), [st.finish], timeout=tmo)
        return self._launch("allreduce", tensors, lambda: [
            self.comm.all_reduce(st.obj, op, async_op=True, timeout=tmo)], [st.finish],
            timeout=tmo)

    def _sparse_allreduce(self, t, op, tmo: float, value) -> RingtreeWork:
        """COO sum (:mod:`ringtree.torch.sparse`); runs to completion before it returns."""
        check_sparse(t, op)
        with self._lock:  # issued in this group's order like any other call
            err = None
            try:
                all_reduce_coo(self.comm, t, tmo)
            except BaseException as e:  # noqa: BLE001 - the Work carries it
                err = e
        work = RingtreeWork("allreduce_sparse", value, self._dispatch)
        self._finish(work, [], err)
        return work

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        staged = [for_reduce(t, opts.reduceOp) for t in tensors]
        tmo = self._tmo(opts)
        return self._launch("allreduce_coalesced", list(tensors), lambda: [
            self.comm.all_reduce(st.obj, op, async_op=True, timeout=tmo)
            for st, op in staged], [st.finish for st, _ in staged])

    def broadcast(self, tensors, opts=None):
        opts = opts if opts is not None else dist.BroadcastOptions()
        root = int(opts.rootRank)
        st = for_move(_one(tensors, "broadcast"), writes=self.rank() != root)
        tmo = self._tmo(opts)
        if self._blocking(opts):
            return self._now("broadcast", tensors, lambda: self.comm.broadcast(
                st.obj, root, timeout=tmo), [st.finish], timeout=tmo)
        return self._launch("broadcast", tensors, lambda: [
            self.comm.broadcast(st.obj, root, async_op=True, timeout=tmo)], [st.finish])

    def reduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceOptions()
        root = int(opts.rootRank)
        st, op = for_reduce(_one(tensors, "reduce"), opts.reduceOp,
                            writes=self.rank() == root)
        tmo = self._tmo(opts)
        if self._blocking(opts):
            return self._now("reduce", tensors, lambda: self.comm.reduce(
                st.obj, root, op, timeout=tmo), [st.finish], timeout=tmo)
        return self._launch("reduce", tensors, lambda: [
            self.comm.reduce(st.obj, root, op, async_op=True, timeout=tmo)], [st.finish])

    def allgather(self, output_tensors, input_tensors, opts=None):
        outs = _one(output_tensors, "allgather")
        inp = for_move(_one(input_tensors, "allgather"), writes=False)
        return self._gather_list("allgather", outs, inp, self._tmo(opts), list(outs))

    def _gather_list(self, name: str, outs, inp: Staged, tmo: float, value) -> RingtreeWork:
        if len(outs) != self.size():
            raise ValueError(f"{name}: {len(outs)} output tensors for {self.size()} ranks")
        staged = [for_move(o) for o in outs]
        if any(o.obj.numel() != inp.obj.numel() for o in staged):
            raise ValueError(f"{name}: output tensors must match the input's size "
                             f"({inp.obj.numel()} elements)")
        return self._launch(name, value, lambda: [self.comm.all_gather(
            inp.obj, out=[o.obj.reshape(inp.obj.shape) for o in staged], async_op=True,
            timeout=tmo)], [o.finish for o in staged])

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """``output_lists[r][j]`` receives rank r's ``input_list[j]``."""
        n = self.size()
        if len(output_lists) != n:
            raise ValueError(f"allgather_coalesced: {len(output_lists)} output lists for "
                             f"{n} ranks")
        if any(len(outs) != len(input_list) for outs in output_lists):
            raise ValueError("allgather_coalesced: every output list must have one tensor "
                             f"per input tensor ({len(input_list)})")
        tmo = self._tmo(opts)
        ins = [for_move(t, writes=False) for t in input_list]
        staged = [[for_move(output_lists[r][j]) for r in range(n)] for j in range(len(ins))]
        for inp, outs in zip(ins, staged):
            if any(o.obj.numel() != inp.obj.numel() for o in outs):
                raise ValueError("allgather_coalesced: output tensors must match their "
                                 f"input's size ({inp.obj.numel()} elements)")

        def issue() -> list:
            return [self.comm.all_gather(inp.obj, out=[o.obj.reshape(inp.obj.shape)
                                                       for o in outs],
                                         async_op=True, timeout=tmo)
                    for inp, outs in zip(ins, staged) if inp.obj.numel()]
        return self._launch("allgather_coalesced", output_lists, issue,
                            [o.finish for outs in staged for o in outs], timeout=tmo)

    def all_gather_single(self, output, input, opts=None):  # noqa: A002 - torch's name
        o, i = for_move(output), for_move(input, writes=False)
        tmo = self._tmo(opts)
        return self._launch("all_gather_single", [output], lambda: [
            self.comm.all_gather(i.obj, out=o.obj, async_op=True, timeout=tmo)], [o.finish])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        pairs = [(for_move(o), for_move(i, writes=False)) for o, i in zip(outputs, inputs)]
        tmo = self._tmo(opts)
        return self._launch("all_gather_single_coalesced", list(outputs), lambda: [
            self.comm.all_gather(i.obj, out=o.obj, async_op=True, timeout=tmo)
            for o, i in pairs], [o.finish for o, _ in pairs])

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.GatherOptions()
        root, n = int(opts.rootRank), self.size()
        inp = for_move(_one(input_tensors, "gather"), writes=False)
        tmo = self._tmo(opts)
        if self.rank() != root:
            return self._launch("gather", output_tensors, lambda: [
                self.comm.gather(inp.obj, root, async_op=True, timeout=tmo)])
        outs = [for_move(o) for o in _one(output_tensors, "gather")]
        if len(outs) != n:
            raise ValueError(f"gather: {len(outs)} output tensors for {n} ranks")
        flat = torch.empty((n, *inp.obj.shape), dtype=inp.obj.dtype)

        def unpack() -> None:
            for k, o in enumerate(outs):
                o.obj.copy_(flat[k].reshape(o.obj.shape))
            run_all([o.finish for o in outs])
        return self._launch("gather", list(output_tensors[0]), lambda: [
            self.comm.gather(inp.obj, root, out=flat, async_op=True, timeout=tmo)], [unpack])

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.ScatterOptions()
        root, n = int(opts.rootRank), self.size()
        out = for_move(_one(output_tensors, "scatter"))
        tmo = self._tmo(opts)
        flat = None
        if self.rank() == root:
            ins = [for_move(t, writes=False).obj for t in _one(input_tensors, "scatter")]
            if len(ins) != n:
                raise ValueError(f"scatter: {len(ins)} input tensors for {n} ranks")
            flat = torch.stack([t.reshape(out.obj.shape) for t in ins])
        return self._launch("scatter", output_tensors, lambda: [
            self.comm.scatter(flat, root, out=out.obj, async_op=True, timeout=tmo)],
            [out.finish])

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        out, op = for_reduce(_one(output_tensors, "reduce_scatter"), opts.reduceOp)
        ins = [for_reduce(t, opts.reduceOp, writes=False)[0].obj
               for t in _one(input_tensors, "reduce_scatter")]
        tmo = self._tmo(opts)
        return self._launch("reduce_scatter", output_tensors, lambda: [
            self.comm.reduce_scatter([t.reshape(out.obj.shape) for t in ins], op, out=out.obj,
                                     async_op=True, timeout=tmo)], [out.finish])

    def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        out, op = for_reduce(output, opts.reduceOp)
        inp, _ = for_reduce(input, opts.reduceOp, writes=False)
        tmo = self._tmo(opts)
        return self._launch("reduce_scatter_single", [output], lambda: [
            self.comm.reduce_scatter(inp.obj, op, out=out.obj, async_op=True, timeout=tmo)],
            [out.finish])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        pairs = [(for_reduce(o, opts.reduceOp), for_reduce(i, opts.reduceOp, writes=False)[0])
                 for o, i in zip(outputs, inputs)]
        tmo = self._tmo(opts)
        return self._launch("reduce_scatter_single_coalesced", list(outputs), lambda: [
            self.comm.reduce_scatter(i.obj, op, out=o.obj, async_op=True, timeout=tmo)
            for (o, op), i in pairs], [o.finish for (o, _), _ in pairs])

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def alltoall(self, output_tensors, input_tensors, opts=None):
        n = self.size()
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError(f"alltoall: expected {n} input and output tensors")
        ins = [for_move(t, writes=False).obj.reshape(-1) for t in input_tensors]
        outs = [for_move(t) for t in output_tensors]
        flat_in = torch.cat(ins) if ins else torch.empty(0)
        flat_out = torch.empty(sum(o.obj.numel() for o in outs), dtype=flat_in.dtype)
        ss, rs = [t.numel() for t in ins], [o.obj.numel() for o in outs]
        tmo = self._tmo(opts)

        def unpack() -> None:
            off = 0
            for o in outs:
                k = o.obj.numel()
                o.obj.copy_(flat_out[off:off + k].reshape(o.obj.shape))
                off += k
            run_all([o.finish for o in outs])
        return self._launch("alltoall", output_tensors, lambda: [self.comm.all_to_all(
            flat_in, out=flat_out, send_splits=ss, recv_splits=rs, async_op=True,
            timeout=tmo)], [unpack])

    def all_to_all_single(self, output, input, output_split_sizes=None,  # noqa: A002
                          input_split_sizes=None, opts=None):
        n = self.size()
        o, i = for_move(output), for_move(input, writes=False)
        tmo = self._tmo(opts)
        if not output_split_sizes and not input_split_sizes:
            def issue() -> list:
                return [self.comm.all_to_all(i.obj, out=o.obj, async_op=True, timeout=tmo)]
        else:
            rin = input.shape[0] if input.dim() else 1
            rout = output.shape[0] if output.dim() else 1
            ss = _splits(input_split_sizes or [], rin, n, "input")
            rs = _splits(output_split_sizes or [], rout, n, "output")
            xi, xo = _rows(i.obj, rin), _rows(o.obj, rout)

            def issue() -> list:
                return [self.comm.all_to_all(xi, out=xo, send_splits=ss, recv_splits=rs,
                                             async_op=True, timeout=tmo)]
        return self._launch("all_to_all_single", [output], issue, [o.finish])

    alltoall_base = all_to_all_single

    def barrier(self, opts=None):
        tmo = self._tmo(opts)
        if self._blocking(opts):
            return self._now("barrier", [], lambda: self.comm.barrier(timeout=tmo),
                             timeout=tmo)
        return self._launch("barrier", [], lambda: [
            self.comm.barrier(async_op=True, timeout=tmo)], timeout=tmo)

    def monitored_barrier(self, timeout=None, wait_all_ranks: bool = False) -> None:
        """gloo's monitored barrier over the group's store: rank 0 names the ranks that
        did not arrive (:mod:`ringtree.torch.monitored`; ``dist.monitored_barrier`` comes
        here for ringtree groups)."""
        t = self.timeout if timeout is None else timeout
        t = t.total_seconds() if isinstance(t, timedelta) else float(t)
        with self._lock:
            self._mb_seq = getattr(self, "_mb_seq", 0) + 1
            seq = self._mb_seq
        monitored_barrier(self.comm.store, self.rank(), self.size(), seq, max(t, 0.0),
                          wait_all_ranks)

    # ---- point to point ------------------------------------------------------------------

    def send(self, tensors, dstRank, tag=0):  # noqa: N803 - torch's names
        st = for_move(_one(tensors, "send"), writes=False)
        return self._launch("send", tensors, lambda: [
            self.comm.isend(st.obj, int(dstRank), int(tag))])

    def recv(self, tensors, srcRank, tag=0):  # noqa: N803
        st = for_move(_one(tensors, "recv"))
        work = self._launch("recv", tensors, lambda: [
            self.comm.irecv(st.obj, int(srcRank), int(tag))], [st.finish])
        work._source = int(srcRank)
        return work

    def recv_anysource(self, tensors, tag=0):
        """Receive from whichever rank's message on ``tag`` arrives first."""
        st = for_move(_one(tensors, "recv"))
        tag = int(tag)
        if not 0 <= tag < 1 << 16:
            raise ValueError(f"tag {tag} must be in [0, 65536)")
        work = RingtreeWork("recv_anysource", tensors, self._dispatch)
        peers = [r for r in range(self.size()) if r != self.rank()]

        def on_match(peer: int) -> None:  # on a thread of the engine's, not the driver
            with self._lock:
                part = self.comm.irecv(st.obj, peer, tag)
            work._source = peer
            self._when_all(work, [part], [st.finish])

        def probed(p) -> None:
            if p.exception() is not None:
                self._finish(work, [], p.exception())

        with self._lock:
            if self._coalescing is not None:
                self._coalescing.append(work)
        self.engine.probe(P2P_CHANNEL_BASE + tag, peers, on_match,
                          self.timeout).add_done_callback(probed)
        return work

    # ---- coalescing (torch's _coalescing_manager with a device) --------------------------

    def startCoalescing(self, device=None) -> None:  # noqa: N802
        with self._lock:
            self._coalescing = []

    def endCoalescing(self, device=None) -> RingtreeWork:  # noqa: N802
        with self._lock:
            works, self._coalescing = self._coalescing or [], None
        values: list = []
        for w in works:
            v = w._result
            values.extend(v if isinstance(v, list) else [v])
        combined = RingtreeWork("coalesced", values, self._dispatch)
        self._when_all(combined, works, [])
        return combined

    _start_coalescing = startCoalescing
    _end_coalescing = endCoalescing
