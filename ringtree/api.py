"""The collectives a Communicator offers, with ``torch.distributed`` names and semantics.

Buffers are NumPy arrays, torch CPU tensors or buffer-protocol objects, used in place
(zero-copy). Without ``out=`` an operation writes into its input the way torch does
(all_reduce, broadcast) or allocates the result (all_gather, gather ...). With
``async_op=True`` it returns a :class:`~ringtree.work.Work`. Every argument is checked
here, before anything is sent.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence

import numpy as np

from ringtree.core.aliasing import check_out
from ringtree.core.ir import Buf, Collective, Step, inp, out, split_even
from ringtree.core.plan import Call, CStep, Desc, Region
from ringtree.dtypes import DType, as_flat
from ringtree.ops import ReduceOp, Reducer, resolve

_P2P_CODE = 200


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _alloc_like(x: object, shape: tuple[int, ...], dt: DType):
    """A new result buffer of the caller's kind (torch tensor or NumPy array)."""
    if type(x).__module__.startswith("torch"):
        import torch

        return torch.empty(shape, dtype=x.dtype)  # type: ignore[attr-defined]
    if dt is DType.BFLOAT16:
        return np.empty(shape, dtype=getattr(x, "dtype", np.uint16))
    return np.empty(shape, dtype=dt.storage)


def _shape(x: object) -> tuple[int, ...]:
    shape = getattr(x, "shape", None)
    if shape is None:
        shape = memoryview(x).shape  # type: ignore[arg-type]
    return tuple(shape)


class CollectivesMixin:
    """Mixed into :class:`ringtree.Communicator`; relies on :class:`ringtree.comm.CommCore`."""

    rank: int
    size: int

    # ---- shared preparation ---------------------------------------------------------

    def _check_root(self, root: int) -> int:
        if not isinstance(root, (int, np.integer)) or not 0 <= int(root) < self.size:
            raise ValueError(f"root {root!r} out of range for a communicator of {self.size} "
                             f"ranks")
        return int(root)

    def _call(self, coll: Collective, inp: np.ndarray | None, outp: np.ndarray | None,
              dt: DType, red: Reducer | None, count: int, root: int, algo: str | None,
              in_blocks: tuple[int, ...], out_blocks: tuple[int, ...],
              in_place: bool) -> Call:
        itemsize = dt.itemsize
        nbytes = count * itemsize * max(len(in_blocks), len(out_blocks), 1)
        explicit = algo is not None
        algo = self._choose_algo(coll, nbytes, algo)  # type: ignore[attr-defined]
        if algo.startswith("collnet"):
            algo = self._collnet_algo(coll, algo, red, dt, nbytes,  # type: ignore
                                      explicit)
        prog, steps = self._plan(coll, algo, root, in_blocks, out_blocks,  # type: ignore
                                 count, itemsize, in_place)
        if red is not None and red.op is ReduceOp.PREMUL_SUM and inp is not None:
            scaled = np.empty_like(inp)
            red.premultiply(inp, scaled)
            inp, in_place = scaled, False
            prog, steps = self._plan(coll, algo, root, in_blocks,  # type: ignore[attr-defined]
                                     out_blocks, count, itemsize, False)
        elif steps is None and inp is not None:  # the algorithm cannot run in place
            inp, in_place = inp.copy(), False
            prog, steps = self._plan(coll, algo, root, in_blocks,  # type: ignore[attr-defined]
                                     out_blocks, count, itemsize, False)
        scratch = None
        if prog.scratch:
            scratch = np.zeros(prog.blocks(Buf.SCRATCH) * count, dtype=dt.storage)
        desc = self._desc(coll, count, dt, red, root, algo)  # type: ignore[attr-defined]
        post = None
        if red is not None and red.op is ReduceOp.AVG and outp is not None and (
                coll is not Collective.REDUCE or self.rank == root):
            n = self.size

            def post() -> None:
                red.postdivide(outp, n)
        return Call(steps, [inp, outp, scratch], red, desc, post=post)

    def _run(self, call: Call, async_op: bool, result: object, timeout: float | None):
        return self._issue(call, async_op, result, timeout)  # type: ignore[attr-defined]

    # ---- collectives ----------------------------------------------------------------

    def all_reduce(self, x, op=ReduceOp.SUM, *, out=None, async_op: bool = False,
                   algo: str | None = None, timeout: float | None = None):
        """Reduce ``x`` over all ranks; the result replaces ``x`` (or goes to ``out``)."""
        xa, dt = as_flat(x, "all_reduce input", writable=out is None)
        oa = xa
        if out is not None:
            oa, odt = as_flat(out, "all_reduce out")
            self._same(dt, odt, xa.size, oa.size, "all_reduce")
        red = resolve(op, dt)
        in_place = _addr(oa) == _addr(xa)
        check_out("all_reduce", xa, oa, in_place)
        call = self._call(Collective.ALL_REDUCE, xa, oa, dt, red, xa.size, -1, algo,
                          (xa.size,), (xa.size,), in_place)
        return self._run(call, async_op, x if out is None else out, timeout)

    def broadcast(self, x, root: int = 0, *, async_op: bool = False, algo: str | None = None,
                  timeout: float | None = None):
        """Copy root's ``x`` into ``x`` on every rank."""
        root = self._check_root(root)
        xa, dt = as_flat(x, "broadcast buffer", writable=self.rank != root)
        call = self._call(Collective.BROADCAST, xa, xa, dt, None, xa.size, root, algo,
                          (xa.size,), (xa.size,), True)
        return self._run(call, async_op, x, timeout)

    def reduce(self, x, root: int = 0, op=ReduceOp.SUM, *, out=None, async_op: bool = False,
               algo: str | None = None, timeout: float | None = None):
        """Reduce to ``root``: its ``x`` (or ``out``) gets the result; others are untouched."""
        root = self._check_root(root)
        is_root = self.rank == root
        xa, dt = as_flat(x, "reduce input", writable=is_root and out is None)
        red = resolve(op, dt)
        if is_root:
            oa = xa
            if out is not None:
                oa, odt = as_flat(out, "reduce out")
                self._same(dt, odt, xa.size, oa.size, "reduce")
            in_place = _addr(oa) == _addr(xa)
            check_out("reduce", xa, oa, in_place)
            result = x if out is None else out
        else:
            oa, in_place, result = np.empty_like(xa), False, None
        call = self._call(Collective.REDUCE, xa, oa, dt, red, xa.size, root, algo,
                          (xa.size,), (xa.size,), in_place)
        return self._run(call, async_op, result, timeout)

    def all_gather(self, x, *, out=None, async_op: bool = False, algo: str | None = None,
                   timeout: float | None = None):
        """Concatenate every rank's ``x``: result shape ``(size, *x.shape)`` unless ``out``
        (an array of size·x.size elements, or a list of ``size`` arrays) is given."""
        xa, dt = as_flat(x, "all_gather input", writable=False)
        n, result, outs = self.size, out, None
        if isinstance(out, (list, tuple)):
            outs = out
            if len(outs) != n:
                raise ValueError(f"all_gather: out list has {len(outs)} entries, expected {n}")
            out = None
        if out is None:
            out = _alloc_like(x, (n, *_shape(x)), dt)
            result = result if outs is not None else out
        oa, odt = as_flat(out, "all_gather out")
        self._same(dt, odt, xa.size * n, oa.size, "all_gather (out must hold size × input)")
        in_place = _addr(xa) == _addr(oa) + self.rank * xa.nbytes and xa.size > 0
        check_out("all_gather", xa, oa, in_place)
        post = _scatter_into(oa, outs, xa.size, dt) if outs is not None else None
        call = self._call(Collective.ALL_GATHER, xa, oa, dt, None, xa.size, -1, algo,
                          (xa.size,), (xa.size,) * n, in_place)
        call.post = post
        return self._run(call, async_op, result, timeout)

    def reduce_scatter(self, x, op=ReduceOp.SUM, *, out=None, async_op: bool = False,
                       algo: str | None = None, timeout: float | None = None):
        """Reduce ``x`` (``size`` equal blocks, or a list of ``size`` arrays) and give rank
        r block r of the result, in ``out`` or a new array."""
        n = self.size
        if isinstance(x, (list, tuple)):
            if len(x) != n:
                raise ValueError(f"reduce_scatter: input list has {len(x)} entries, "
                                 f"expected {n}")
            parts = [as_flat(t, "reduce_scatter input")[0] for t in x]
            dts = {as_flat(t, "reduce_scatter input", writable=False)[1] for t in x}
            if len(dts) != 1 or len({p.size for p in parts}) != 1:
                raise ValueError("reduce_scatter: input list entries differ in dtype or size")
            template, xa, dt = x[0], np.concatenate(parts), dts.pop()
        else:
            xa, dt = as_flat(x, "reduce_scatter input", writable=False)
            template = None
            if xa.size % n:
                raise ValueError(f"reduce_scatter: input has {xa.size} elements, not "
                                 f"divisible by {n} ranks")
        count = xa.size // n
        if out is None:
            if template is not None:
                shape = _shape(template)
            else:
                shp = _shape(x)
                shape = shp[1:] if len(shp) > 1 and shp[0] == n else (count,)
            out = _alloc_like(template if template is not None else x, shape, dt)
        oa, odt = as_flat(out, "reduce_scatter out")
        self._same(dt, odt, count, oa.size, "reduce_scatter (out must hold input/size)")
        red = resolve(op, dt)
        in_place = _addr(oa) == _addr(xa) + self.rank * oa.nbytes and count > 0
        check_out("reduce_scatter", xa, oa, in_place)
        call = self._call(Collective.REDUCE_SCATTER, xa, oa, dt, red, count, -1, algo,
                          (count,) * n, (count,), in_place)
        return self._run(call, async_op, out, timeout)

    def gather(self, x, root: int = 0, *, out=None, async_op: bool = False,
               algo: str | None = None, timeout: float | None = None):
        """Root receives every rank's ``x`` (shape ``(size, *x.shape)``); others get None."""
        root = self._check_root(root)
        xa, dt = as_flat(x, "gather input", writable=False)
        n = self.size
        if self.rank == root:
            if out is None:
                out = _alloc_like(x, (n, *_shape(x)), dt)
            oa, odt = as_flat(out, "gather out")
            self._same(dt, odt, xa.size * n, oa.size, "gather (out must hold size × input)")
            check_out("gather", xa, oa,  # in place: the root's input is its block of out
                      _addr(xa) == _addr(oa) + self.rank * xa.nbytes)
            result = out
        else:
            oa, result = None, None
        call = self._call(Collective.GATHER, xa, oa, dt,
                          None, xa.size, root, algo, (xa.size,), (xa.size,) * n, False)
        return self._run(call, async_op, result, timeout)

    def scatter(self, x, root: int = 0, *, out=None, async_op: bool = False,
                algo: str | None = None, timeout: float | None = None):
        """Rank r receives block r of root's ``x`` (``size`` equal blocks) into ``out``.
        Non-root ranks may pass ``x=None`` but then must pass ``out``."""
        root = self._check_root(root)
        n = self.size
        if self.rank == root:
            xa, dt = as_flat(x, "scatter input", writable=False)
            if xa.size % n:
                raise ValueError(f"scatter: input has {xa.size} elements, not divisible by "
                                 f"{n} ranks")
            count = xa.size // n
            if out is None:
                shp = _shape(x)
                out = _alloc_like(x, shp[1:] if len(shp) > 1 and shp[0] == n else (count,),
                                  dt)
            oa, odt = as_flat(out, "scatter out")
            self._same(dt, odt, count, oa.size, "scatter (out must hold input/size)")
            check_out("scatter", xa, oa,  # in place: out is the root's block of the input
                      _addr(oa) == _addr(xa) + self.rank * oa.nbytes)
        else:
            if out is None:
                raise ValueError("scatter: non-root ranks must pass out=")
            oa, dt = as_flat(out, "scatter out")
            xa, count = None, oa.size
        call = self._call(Collective.SCATTER, xa, oa, dt, None, count, root, algo,
                          (count,) * n, (count,), False)
        return self._run(call, async_op, out, timeout)

    def all_to_all(self, x, *, out=None, send_splits: Sequence[int] | None = None,
                   recv_splits: Sequence[int] | None = None, async_op: bool = False,
                   algo: str | None = None, timeout: float | None = None):
        """Rank r sends block j of ``x`` to rank j and receives block r of every rank.

        Equal blocks by default; ``send_splits``/``recv_splits`` give uneven block sizes
        in rows of dimension 0 (torch's ``all_to_all_single``). Missing ``recv_splits``
        are exchanged first.
        """
        n = self.size
        xa, dt = as_flat(x, "all_to_all input", writable=False)
        shp = _shape(x)
        row = int(np.prod(shp[1:])) if len(shp) > 1 else 1
        uneven = send_splits is not None or recv_splits is not None
        if not uneven:
            if xa.size % n:
                raise ValueError(f"all_to_all: input has {xa.size} elements, not divisible "
                                 f"by {n} ranks")
            count = xa.size // n
            in_blocks = out_blocks = (count,) * n
        else:
            rows = shp[0] if shp else xa.size
            ss = [int(v) for v in (send_splits if send_splits is not None
                                   else [rows // n] * n)]
            if len(ss) != n or min(ss) < 0 or sum(ss) != rows:
                raise ValueError(f"all_to_all: send_splits {ss} must be {n} non-negative "
                                 f"sizes summing to {rows}")
            if recv_splits is None:
                got = self.all_to_all(np.array(ss, dtype=np.int64))
                recv_splits = [int(v) for v in got]
            rs = [int(v) for v in recv_splits]
            if len(rs) != n or min(rs) < 0:
                raise ValueError(f"all_to_all: recv_splits {rs} must be {n} non-negative sizes")
            in_blocks = tuple(v * row for v in ss)
            out_blocks = tuple(v * row for v in rs)
            count = 0
            algo = algo or "pairwise"
        if out is None:
            oshape = shp if not uneven else (sum(out_blocks) // row, *shp[1:])
            out = _alloc_like(x, oshape, dt)
        oa, odt = as_flat(out, "all_to_all out")
        self._same(dt, odt, sum(out_blocks), oa.size, "all_to_all")
        in_place = _addr(oa) == _addr(xa) and xa.size > 0
        check_out("all_to_all", xa, oa, in_place)
        call = self._call(Collective.ALL_TO_ALL, xa, oa, dt, None, count, -1, algo,
                          in_blocks, out_blocks, in_place)
        return self._run(call, async_op, out, timeout)

    def barrier(self, *, async_op: bool = False, timeout: float | None = None):
        """Return once every rank has entered the barrier (dissemination algorithm)."""
        red = resolve(ReduceOp.BOR, DType.UINT8)
        call = self._call(Collective.BARRIER, None, None, DType.UINT8, red, 1, -1, None,
                          (), (), False)
        call.bufs[2][:] = 1  # type: ignore[index]
        return self._run(call, async_op, None, timeout)

    # ---- point to point -------------------------------------------------------------

    def _p2p(self, x, peer: int, tag: int, sending: bool, async_op: bool,
             timeout: float | None):
        if not isinstance(peer, (int, np.integer)) or not 0 <= int(peer) < self.size:
            raise ValueError(f"peer rank {peer!r} out of range for {self.size} ranks")
        self._precheck(timeout)  # type: ignore[attr-defined]
        peer = int(peer)
        if peer == self.rank:
            raise ValueError(f"rank {self.rank} cannot send to or receive from itself")
        if not 0 <= int(tag) < 1 << 16:
            raise ValueError(f"tag {tag} must be in [0, 65536)")
        xa, dt = as_flat(x, "send buffer" if sending else "recv buffer", writable=not sending)
        key = (peer, int(tag), "s" if sending else "r")
        seq = self._p2p_seq.get(key, 0) + 1  # type: ignore[attr-defined]
        self._p2p_seq[key] = seq  # type: ignore[attr-defined]
        region = Region(int(Buf.INPUT if sending else Buf.OUTPUT), 0, xa.size)
        slices = _slices(xa.size, self.slice_bytes // dt.itemsize)  # type: ignore
        if sending:
            step = Step(src=inp(0), send_to=(peer,))
            cs = CStep(0, step, region, None, xa.size, slices, ())
        else:
            step = Step(dst=out(0), recv_from=(peer,))
            cs = CStep(0, step, None, region, xa.size, slices, ())
        name = "send" if sending else "recv"
        desc = Desc("send/recv", xa.size, dt.value, dt.code, "-", 0, int(tag), seq, "p2p",
                    _P2P_CODE)
        desc.name = name
        from ringtree.comm import P2P_CHANNEL_BASE

        call = Call([[cs]], [xa, xa, None], None, desc,
                    channel_base=P2P_CHANNEL_BASE + int(tag))
        return self._run(call, async_op, x, timeout)

    def send(self, x, dst: int, tag: int = 0, *, timeout: float | None = None):
        """Send ``x`` to rank ``dst`` (matched in order per (dst, tag))."""
        return self._p2p(x, dst, tag, True, False, timeout)

    def recv(self, x, src: int, tag: int = 0, *, timeout: float | None = None):
        """Receive into ``x`` from rank ``src``; returns ``x``."""
        return self._p2p(x, src, tag, False, False, timeout)

    def isend(self, x, dst: int, tag: int = 0):
        return self._p2p(x, dst, tag, True, True, None)

    def irecv(self, x, src: int, tag: int = 0):
        return self._p2p(x, src, tag, False, True, None)

    # ---- objects (pickle: only when the user asks for object collectives) ------------

    def broadcast_object(self, obj: object = None, root: int = 0) -> object:
        """Root's picklable ``obj`` on every rank. Unpickles what root sent: use only
        within a trusted job."""
        root = self._check_root(root)
        data = pickle.dumps(obj) if self.rank == root else b""
        size = np.array([len(data)], dtype=np.int64)
        self.broadcast(size, root)
        buf = np.frombuffer(bytearray(data), dtype=np.uint8) if self.rank == root else \
            np.empty(int(size[0]), dtype=np.uint8)
        self.broadcast(buf, root)
        return obj if self.rank == root else pickle.loads(buf.tobytes())

    def all_gather_object(self, obj: object) -> list:
        """Every rank's picklable ``obj``, in rank order (unpickles peers' data)."""
        data = pickle.dumps(obj)
        sizes = self.all_gather(np.array([len(data)], dtype=np.int64)).reshape(-1)
        width = int(sizes.max()) if sizes.size else 0
        mine = np.zeros(width, dtype=np.uint8)
        mine[:len(data)] = np.frombuffer(data, dtype=np.uint8)
        table = self.all_gather(mine).reshape(self.size, width)
        return [pickle.loads(table[r, :int(sizes[r])].tobytes()) for r in range(self.size)]

    # ---- helpers --------------------------------------------------------------------

    @staticmethod
    def _same(dt: DType, odt: DType, want: int, got: int, what: str) -> None:
        if dt is not odt:
            raise TypeError(f"{what}: out has dtype {odt.value}, input has {dt.value}")
        if want != got:
            raise ValueError(f"{what}: out has {got} elements, expected {want}")


def _slices(length: int, slice_elems: int) -> tuple[tuple[int, int], ...]:
    slice_elems = max(1, slice_elems)
    nsl = -(-length // slice_elems) if length else 0
    return tuple(split_even(length, nsl, k) for k in range(nsl))


def _scatter_into(flat: np.ndarray, outs, count: int, dt: DType):
    """Validate a list of output buffers now; return the copy to run after the gather."""
    views = []
    for i, o in enumerate(outs):
        oa, odt = as_flat(o, f"all_gather out[{i}]")
        if oa.size != count or odt is not dt:
            raise ValueError(f"all_gather: out[{i}] is {oa.size} × {odt.value}, expected "
                             f"{count} × {dt.value}")
        views.append(oa)

    def post() -> None:
        for i, oa in enumerate(views):
            oa[...] = flat[i * count:(i + 1) * count]
    return post
