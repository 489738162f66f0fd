"""Argument rules of every operation: each builder validates one call and returns its
frozen :class:`~ringtree.runtime.planner.CallSpec` (mpi4py's ``msgbuffer.pxi`` message
builders, one per collective, own all buffer, count and in-place rules the same way).

Buffers are NumPy arrays, torch CPU tensors or buffer-protocol objects, used in place
(zero-copy). Without ``out=`` an operation writes into its input the way torch does
(all_reduce, broadcast) or allocates the result (all_gather, gather ...). Every argument
is checked here, before anything is sent; nothing here knows about algorithms, plans or
transports (that is :mod:`ringtree.runtime.planner`).
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np

from ringtree.dtypes import DType, as_flat
from ringtree.ir.collectives import IN_OUTPUT, OUT_INPUT, Collective
from ringtree.ops import ReduceOp, resolve
from ringtree.runtime.aliasing import check_out
from ringtree.runtime.planner import CallSpec
from ringtree.transports.shm_cma import address  # compiled: __array_interface__ is ~2 µs

_BARRIER_OP = resolve(ReduceOp.BOR, DType.UINT8)


def _in_place(coll: Collective, xa: np.ndarray, oa: np.ndarray, rank: int) -> bool:
    """Does ringtree run this call in place (the operands at the record's layout)?"""
    return coll.spec.in_place and _aliased(coll, xa, oa, rank)


def _aliased(coll: Collective, xa: np.ndarray, oa: np.ndarray, rank: int) -> bool:
    """Do the operands sit the way the collective's record says they do in place?"""
    spec = coll.spec
    if xa.size == 0:
        return False
    if spec.alias == IN_OUTPUT:
        return address(xa) == address(oa) + rank * xa.nbytes
    if spec.alias == OUT_INPUT:
        return address(oa) == address(xa) + rank * oa.nbytes
    return address(oa) == address(xa)


def _alloc_like(x: Any, shape: tuple[int, ...], dt: DType):
    """A new result buffer of the caller's kind (torch tensor or NumPy array)."""
    if type(x).__module__.startswith("torch"):
        import torch

        return torch.empty(shape, dtype=x.dtype)
    if dt is DType.BFLOAT16:
        return np.empty(shape, dtype=getattr(x, "dtype", np.uint16))
    return np.empty(shape, dtype=dt.storage)


def _shape(x: Any) -> tuple[int, ...]:
    shape = getattr(x, "shape", None)
    if shape is None:
        shape = memoryview(x).shape
    return tuple(shape)


def check_root(root: object, size: int) -> int:
    if not isinstance(root, (int, np.integer)) or not 0 <= int(root) < size:
        raise ValueError(f"root {root!r} out of range for a communicator of {size} ranks")
    return int(root)


def _same(dt: DType, odt: DType, want: int, got: int, what: str) -> None:
    if dt is not odt:
        raise TypeError(f"{what}: out has dtype {odt.value}, input has {dt.value}")
    if want != got:
        raise ValueError(f"{what}: out has {got} elements, expected {want}")


def _spec(coll: Collective, count: int, dt: DType, red, root: int, in_place: bool,
          algo: str | None, inp, outp, result, *, blocks=None, post=None) -> CallSpec:
    if algo is not None:
        algo = _algo_name(algo)
    return CallSpec(coll, count, dt, red.op if red is not None else None, root, in_place,
                    algo, blocks, 0, inp, outp, red, result, post)


def _algo_name(algo: str) -> str:
    """The registered name of ``algo=``: lower case; an MSCCL-IR file (``msccl:PATH``,
    ``msccl:NAME``) is read and proven here, before anything is sent."""
    if algo[:6].lower() != "msccl:":
        return algo.lower()
    from ringtree.msccl.catalog import name_of

    return name_of(algo)


# ---- collectives --------------------------------------------------------------------------

def _out_like_input(coll: Collective, what: str, xa: np.ndarray, dt: DType, out,
                    rank: int) -> tuple[np.ndarray, bool]:
    """The output of a reduction whose result has the input's size: ``out`` (same dtype
    and size) or the input itself; and whether the call runs in place."""
    oa = xa
    if out is not None:
        oa, odt = as_flat(out, f"{what} out")
        _same(dt, odt, xa.size, oa.size, what)
    in_place = _in_place(coll, xa, oa, rank)
    check_out(what, xa, oa, in_place)
    return oa, in_place


def for_all_reduce(comm, x, op, out, algo: str | None) -> CallSpec:
    xa, dt = as_flat(x, "all_reduce input", writable=out is None)
    oa, in_place = _out_like_input(Collective.ALL_REDUCE, "all_reduce", xa, dt, out, comm.rank)
    return _spec(Collective.ALL_REDUCE, xa.size, dt, resolve(op, dt), -1, in_place, algo,
                 xa, oa, x if out is None else out)


def for_broadcast(comm, x, root: int, algo: str | None) -> CallSpec:
    root = check_root(root, comm.size)
    xa, dt = as_flat(x, "broadcast buffer", writable=comm.rank != root)
    return _spec(Collective.BROADCAST, xa.size, dt, None, root, True, algo, xa, xa, x)


def for_reduce(comm, x, root: int, op, out, algo: str | None) -> CallSpec:
    root = check_root(root, comm.size)
    is_root = comm.rank == root
    xa, dt = as_flat(x, "reduce input", writable=is_root and out is None)
    red = resolve(op, dt)
    if is_root:
        oa, in_place = _out_like_input(Collective.REDUCE, "reduce", xa, dt, out, comm.rank)
        result = x if out is None else out
    else:
        oa, in_place, result = np.empty_like(xa), False, None
    return _spec(Collective.REDUCE, xa.size, dt, red, root, in_place, algo, xa, oa, result)


def for_all_gather(comm, x, out, algo: str | None) -> CallSpec:
    xa, dt = as_flat(x, "all_gather input", writable=False)
    n, result, outs = comm.size, out, None
    if isinstance(out, (list, tuple)):
        outs = out
        if len(outs) != n:
            raise ValueError(f"all_gather: out list has {len(outs)} entries, expected {n}")
        out = None
    if out is None:
        out = _alloc_like(x, (n, *_shape(x)), dt)
        result = result if outs is not None else out
    oa, odt = as_flat(out, "all_gather out")
    _same(dt, odt, xa.size * n, oa.size, "all_gather (out must hold size × input)")
    in_place = _in_place(Collective.ALL_GATHER, xa, oa, comm.rank)
    check_out("all_gather", xa, oa, in_place)
    post = _scatter_into(oa, outs, xa.size, dt) if outs is not None else None
    return _spec(Collective.ALL_GATHER, xa.size, dt, None, -1, in_place, algo, xa, oa, result,
                 post=post)


def for_reduce_scatter(comm, x, op, out, algo: str | None) -> CallSpec:
    n = comm.size
    if isinstance(x, (list, tuple)):
        if len(x) != n:
            raise ValueError(f"reduce_scatter: input list has {len(x)} entries, expected {n}")
        flats = [as_flat(t, "reduce_scatter input", writable=False) for t in x]
        if len({d for _, d in flats}) != 1 or len({p.size for p, _ in flats}) != 1:
            raise ValueError("reduce_scatter: input list entries differ in dtype or size")
        template, xa, dt = x[0], np.concatenate([p for p, _ in flats]), flats[0][1]
    else:
        xa, dt = as_flat(x, "reduce_scatter input", writable=False)
        template = None
        if xa.size % n:
            raise ValueError(f"reduce_scatter: input has {xa.size} elements, not divisible "
                             f"by {n} ranks")
    count = xa.size // n
    if out is None:
        if template is not None:
            shape = _shape(template)
        else:
            shp = _shape(x)
            shape = shp[1:] if len(shp) > 1 and shp[0] == n else (count,)
        out = _alloc_like(template if template is not None else x, shape, dt)
    oa, odt = as_flat(out, "reduce_scatter out")
    _same(dt, odt, count, oa.size, "reduce_scatter (out must hold input/size)")
    red = resolve(op, dt)
    in_place = _in_place(Collective.REDUCE_SCATTER, xa, oa, comm.rank)
    check_out("reduce_scatter", xa, oa, in_place)
    return _spec(Collective.REDUCE_SCATTER, count, dt, red, -1, in_place, algo, xa, oa, out)


def for_gather(comm, x, root: int, out, algo: str | None) -> CallSpec:
    root = check_root(root, comm.size)
    xa, dt = as_flat(x, "gather input", writable=False)
    n = comm.size
    oa = None
    if comm.rank == root:
        if out is None:
            out = _alloc_like(x, (n, *_shape(x)), dt)
        oa, odt = as_flat(out, "gather out")
        _same(dt, odt, xa.size * n, oa.size, "gather (out must hold size × input)")
        check_out("gather", xa, oa, _aliased(Collective.GATHER, xa, oa, comm.rank))
    else:
        out = None
    return _spec(Collective.GATHER, xa.size, dt, None, root, False, algo, xa, oa, out)


def for_scatter(comm, x, root: int, out, algo: str | None) -> CallSpec:
    root = check_root(root, comm.size)
    n = comm.size
    if comm.rank == root:
        xa, dt = as_flat(x, "scatter input", writable=False)
        if xa.size % n:
            raise ValueError(f"scatter: input has {xa.size} elements, not divisible by "
                             f"{n} ranks")
        count = xa.size // n
        if out is None:
            shp = _shape(x)
            out = _alloc_like(x, shp[1:] if len(shp) > 1 and shp[0] == n else (count,), dt)
        oa, odt = as_flat(out, "scatter out")
        _same(dt, odt, count, oa.size, "scatter (out must hold input/size)")
        check_out("scatter", xa, oa, _aliased(Collective.SCATTER, xa, oa, comm.rank))
    else:
        if out is None:
            raise ValueError("scatter: non-root ranks must pass out=")
        oa, dt = as_flat(out, "scatter out")
        xa, count = None, oa.size
    return _spec(Collective.SCATTER, count, dt, None, root, False, algo, xa, oa, out)


def for_all_to_all(comm, x, out, send_splits: Sequence[int] | None,
                   recv_splits: Sequence[int] | None, algo: str | None) -> CallSpec:
    """Equal blocks, or uneven ones in rows of dimension 0 (``all_to_all_single``);
    missing ``recv_splits`` are exchanged first (a collective of its own)."""
    n = comm.size
    xa, dt = as_flat(x, "all_to_all input", writable=False)
    shp = _shape(x)
    row = int(np.prod(shp[1:])) if len(shp) > 1 else 1
    blocks = None
    if send_splits is None and recv_splits is None:
        if xa.size % n:
            raise ValueError(f"all_to_all: input has {xa.size} elements, not divisible by "
                             f"{n} ranks")
        count, total = xa.size // n, xa.size
    else:
        rows = shp[0] if shp else xa.size
        ss = [int(v) for v in (send_splits if send_splits is not None else [rows // n] * n)]
        if len(ss) != n or min(ss) < 0 or sum(ss) != rows:
            raise ValueError(f"all_to_all: send_splits {ss} must be {n} non-negative sizes "
                             f"summing to {rows}")
        if recv_splits is None:
            recv_splits = [int(v) for v in comm.all_to_all(np.array(ss, dtype=np.int64))]
        rs = [int(v) for v in recv_splits]
        if len(rs) != n or min(rs) < 0:
            raise ValueError(f"all_to_all: recv_splits {rs} must be {n} non-negative sizes")
        blocks = (tuple(v * row for v in ss), tuple(v * row for v in rs))
        count, total, algo = 0, sum(blocks[1]), algo or "pairwise"
    if out is None:
        out = _alloc_like(x, shp if blocks is None else (total // row, *shp[1:]), dt)
    oa, odt = as_flat(out, "all_to_all out")
    _same(dt, odt, total, oa.size, "all_to_all")
    in_place = _in_place(Collective.ALL_TO_ALL, xa, oa, comm.rank)
    check_out("all_to_all", xa, oa, in_place)
    return _spec(Collective.ALL_TO_ALL, count, dt, None, -1, in_place, algo, xa, oa, out,
                 blocks=blocks)


def for_barrier() -> CallSpec:
    return _spec(Collective.BARRIER, 1, DType.UINT8, _BARRIER_OP, -1, False, None,
                 None, None, None)


def for_p2p(comm, x, peer: int, tag: int, sending: bool) -> CallSpec:
    """A send (``root`` = destination) or receive (``root`` = source); ``algo`` names it."""
    if not isinstance(peer, (int, np.integer)) or not 0 <= int(peer) < comm.size:
        raise ValueError(f"peer rank {peer!r} out of range for {comm.size} ranks")
    if int(peer) == comm.rank:
        raise ValueError(f"rank {comm.rank} cannot send to or receive from itself")
    if not 0 <= int(tag) < 1 << 16:
        raise ValueError(f"tag {tag} must be in [0, 65536)")
    xa, dt = as_flat(x, "send buffer" if sending else "recv buffer", writable=not sending)
    return CallSpec(None, xa.size, dt, None, int(peer), False, "send" if sending else "recv",
                    None, int(tag), xa, xa, None, x, None)


# ---- objects (pickle: only when the user asks for object collectives) ----------------------

def broadcast_object(comm, obj: object, root: int) -> object:
    """Root's picklable ``obj`` on every rank (unpickles what root sent: trusted jobs only)."""
    root = check_root(root, comm.size)
    data = pickle.dumps(obj) if comm.rank == root else b""
    size = np.array([len(data)], dtype=np.int64)
    comm.broadcast(size, root)
    buf = np.frombuffer(bytearray(data), dtype=np.uint8) if comm.rank == root else \
        np.empty(int(size[0]), dtype=np.uint8)
    comm.broadcast(buf, root)
    return obj if comm.rank == root else pickle.loads(buf.tobytes())


def all_gather_object(comm, obj: object) -> list:
    """Every rank's picklable ``obj``, in rank order (unpickles peers' data)."""
    data = pickle.dumps(obj)
    sizes = comm.all_gather(np.array([len(data)], dtype=np.int64)).reshape(-1)
    width = int(sizes.max()) if sizes.size else 0
    mine = np.zeros(width, dtype=np.uint8)
    mine[:len(data)] = np.frombuffer(data, dtype=np.uint8)
    table = comm.all_gather(mine).reshape(comm.size, width)
    return [pickle.loads(table[r, :int(sizes[r])].tobytes()) for r in range(comm.size)]


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
