"""The peers ``ringtree perf`` measures ringtree against: ``torch.distributed`` (gloo) and
mpi4py (Open MPI), behind the :class:`~ringtree.perf.backends.Backend` interface (see
:mod:`ringtree.perf.backends` for how each maps nccl-tests' operations)."""

from __future__ import annotations

import socket

import numpy as np

from ringtree.bootstrap import environ, job
from ringtree.dtypes import DType
from ringtree.perf.backends import (
    MPI_HINT,
    TORCH_HINT,
    Backend,
    BackendUnavailable,
    Operands,
    cpu_name,
)


class GlooBackend(Backend):
    """``torch.distributed`` with the gloo backend, initialised from the env
    (``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE``, as ``ringtree run`` and
    torchrun set them)."""

    name = "gloo"
    nonroot_untouched = False  # gloo's reduce may use a non-root buffer as scratch

    def __init__(self, timeout: float | None = None):
        try:
            import torch
            import torch.distributed as dist
        except ImportError as e:
            raise BackendUnavailable(f"--backend gloo needs PyTorch ({e}); install it with: "
                                     f"{TORCH_HINT}") from None
        import datetime

        self.torch, self.dist = torch, dist
        self.version = torch.__version__.split("+")[0]
        self.rank, self.size, self.local_rank, self.local_size = job.ranks()
        if self.size > 1 and not (environ.get("MASTER_ADDR") and environ.get("MASTER_PORT")):
            raise BackendUnavailable(
                "--backend gloo needs MASTER_ADDR and MASTER_PORT (set by `ringtree run`, "
                "torchrun, or `ringtree perf --nranks N`)")
        if environ.get("MASTER_ADDR") is None:
            environ.export({"MASTER_ADDR": "127.0.0.1"})
        if environ.get("MASTER_PORT") is None:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                environ.export({"MASTER_PORT": s.getsockname()[1]})
        self._owns = not dist.is_initialized()
        if self._owns:
            dist.init_process_group("gloo", init_method="env://", rank=self.rank,
                                    world_size=self.size,
                                    timeout=datetime.timedelta(seconds=timeout or 1800))
        self._works: list = []
        self._ops = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT,
                     "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX,
                     "avg": dist.ReduceOp.AVG}
        self._ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def describe(self) -> str:
        return f"torch {self.version} gloo, {cpu_name()}"

    def unsupported(self, coll: str, dt: DType, op: str | None) -> str | None:
        if dt in (DType.UINT32, DType.UINT64):
            return f"gloo does not support {dt.nccl_name}"
        if op == "mulsum":
            return "gloo has no PREMUL_SUM (torch offers it for NCCL only)"
        if op == "avg" and not dt.is_float:
            return f"gloo's AVG does not support {dt.nccl_name}"
        return None

    def _t(self, a: np.ndarray):
        torch = self.torch
        if a.dtype == np.uint16:  # bfloat16 storage
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(a)

    def run(self, o: Operands, blocking: bool) -> None:
        d, asy = self.dist, not blocking and self.issue_async
        send = self._t(o.send) if o.send is not None else None
        recv = self._t(o.recv) if o.recv is not None else None
        op = self._ops.get(o.op or "sum")
        if o.coll == "sendrecv":
            self._sendrecv(send, recv, o.in_place, blocking)
            return
        if o.coll in ("broadcast", "reduce", "gather", "scatter"):
            w = self._rooted(o, send, recv, op, asy)
        elif o.coll == "all_reduce":
            if not o.in_place:
                recv.copy_(send)
            w = d.all_reduce(recv, op=op, async_op=asy)
        elif o.coll == "all_gather":
            w = self._ag(recv, send, async_op=asy)
        elif o.coll == "reduce_scatter":
            w = self._rs(recv, send, op=op, async_op=asy)
        elif o.coll == "alltoall":  # torch's alltoall must not alias: in-place = copy
            w = d.all_to_all_single(recv, send.clone() if o.in_place else send, async_op=asy)
        else:
            raise ValueError(f"unknown collective {o.coll}")
        if asy and w is not None:
            self._works.append(w)

    def _rooted(self, o: Operands, send, recv, op, asy: bool):
        """broadcast, reduce, gather, scatter: the Work (or None)."""
        d, root = self.dist, o.root
        me = self.rank == root
        if o.coll == "broadcast":
            if me and not o.in_place:
                recv.copy_(send)
            return d.broadcast(recv, src=root, async_op=asy)
        if o.coll == "reduce":
            if not o.in_place:
                recv.copy_(send)
            return d.reduce(recv, dst=root, op=op, async_op=asy)
        if o.coll == "gather":
            return d.gather(send, self._blocks(recv, o.count) if me else None, dst=root,
                            async_op=asy)
        return d.scatter(recv, self._blocks(send, o.count) if me else None, src=root,
                         async_op=asy)

    def _sendrecv(self, send, recv, in_place: bool, blocking: bool) -> None:
        """Send to the next rank, receive from the previous (nccl-tests' sendrecv)."""
        d, n, r = self.dist, self.size, self.rank
        if n == 1:
            if not in_place:
                recv.copy_(send)
            return
        ops = [d.P2POp(d.isend, send, (r + 1) % n), d.P2POp(d.irecv, recv, (r - 1) % n)]
        works = d.batch_isend_irecv(ops)
        if blocking or not self.issue_async:
            for w in works:
                w.wait()
        else:
            self._works.extend(works)

    def _blocks(self, t, count: int) -> list:
        return [t[i * count:(i + 1) * count] for i in range(self.size)]

    def wait(self) -> None:
        works, self._works = self._works, []
        for w in works:
            w.wait()

    def barrier(self) -> None:
        self.dist.barrier()

    def allreduce_f64(self, value: float, op: str) -> float:
        t = self.torch.tensor([value], dtype=self.torch.float64)
        self.dist.all_reduce(t, op={"sum": self.dist.ReduceOp.SUM,
                                    "min": self.dist.ReduceOp.MIN,
                                    "max": self.dist.ReduceOp.MAX}[op])
        return float(t[0])

    def _allgather_u8(self, buf: np.ndarray) -> np.ndarray:
        out = self.torch.empty(self.size * buf.size, dtype=self.torch.uint8)
        self._ag(out, self.torch.from_numpy(buf))
        return out.numpy()

    def close(self) -> None:
        if self._owns and self.dist.is_initialized():
            self.dist.destroy_process_group()


# ============================================================================ MPI


class MpiBackend(Backend):
    """mpi4py's ``COMM_WORLD``: start with ``mpirun -n N ringtree perf ... --backend mpi``
    (or ``ringtree perf --backend mpi --nranks N``, which calls mpirun)."""

    name = "mpi"

    def __init__(self):
        try:
            from mpi4py import MPI
        except ImportError as e:
            raise BackendUnavailable(f"--backend mpi needs mpi4py and an MPI library ({e}); "
                                     f"install them with: {MPI_HINT}") from None
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        _, _, self.local_rank, self.local_size = job.ranks()  # mpirun's local numbers
        lib = MPI.Get_library_version().strip().splitlines()[0]
        self.library = lib.split(",")[0].strip()
        major, minor = MPI.Get_version()
        digits = "".join(ch if ch.isdigit() or ch == "." else " " for ch in self.library)
        nums = [t for t in digits.split() if "." in t]
        self.version = nums[0] if nums else f"{major}.{minor}"
        self._types = {
            DType.INT8: MPI.INT8_T, DType.UINT8: MPI.UINT8_T, DType.INT32: MPI.INT32_T,
            DType.UINT32: MPI.UINT32_T, DType.INT64: MPI.INT64_T, DType.UINT64: MPI.UINT64_T,
            DType.FLOAT32: MPI.FLOAT, DType.FLOAT64: MPI.DOUBLE,
        }
        self._ops = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}

    def describe(self) -> str:
        return f"mpi4py, {self.library}, {cpu_name()}"

    def unsupported(self, coll: str, dt: DType, op: str | None) -> str | None:
        if op is not None and op not in self._ops:
            return f"MPI has no {op} reduction"
        if op is not None and dt not in self._types:
            return f"MPI has no {dt.nccl_name} reductions"
        return None

    def _b(self, a: np.ndarray | None, dt: DType):
        if a is None:
            return None
        if dt in self._types:
            return [a, self._types[dt]]
        return [a.view(np.uint8), self.MPI.BYTE]

    def run(self, o: Operands, blocking: bool) -> None:
        MPI, c, dt = self.MPI, self.comm, o.dtype
        r, n = self.rank, self.size
        op = self._ops.get(o.op or "sum")
        inp = MPI.IN_PLACE
        if o.coll in ("broadcast", "reduce", "gather", "scatter"):
            self._rooted(o, op)
        elif o.coll == "all_reduce":
            c.Allreduce(inp if o.in_place else self._b(o.send, dt), self._b(o.recv, dt), op)
        elif o.coll == "all_gather":
            c.Allgather(inp if o.in_place else self._b(o.send, dt), self._b(o.recv, dt))
        elif o.coll == "reduce_scatter":
            if o.in_place:  # MPI leaves the result in block 0; nccl-tests expects block r
                c.Reduce_scatter_block(inp, self._b(o.send, dt), op)
                if r and o.count:
                    o.recv[...] = o.send[:o.count]
            else:
                c.Reduce_scatter_block(self._b(o.send, dt), self._b(o.recv, dt), op)
        elif o.coll == "alltoall":
            c.Alltoall(inp if o.in_place else self._b(o.send, dt), self._b(o.recv, dt))
        elif o.coll == "sendrecv":
            if o.in_place:
                c.Sendrecv_replace(self._b(o.recv, dt), (r + 1) % n, source=(r - 1) % n)
            else:
                c.Sendrecv(self._b(o.send, dt), (r + 1) % n, recvbuf=self._b(o.recv, dt),
                           source=(r - 1) % n)
        else:
            raise ValueError(f"unknown collective {o.coll}")

    def _rooted(self, o: Operands, op) -> None:
        """broadcast, reduce, gather, scatter (MPI's in-place rules at the root)."""
        c, dt, root = self.comm, o.dtype, o.root
        me, inp = self.rank == root, self.MPI.IN_PLACE
        send = inp if o.in_place and me else self._b(o.send, dt)
        recv = self._b(o.recv, dt)
        if o.coll == "broadcast":
            if me and not o.in_place:
                o.recv[...] = o.send
            c.Bcast(recv, root=root)
        elif o.coll == "reduce":
            if o.in_place and not me:
                send = recv
            c.Reduce(send, recv if me else None, op, root=root)
        elif o.coll == "gather":
            c.Gather(send, recv if me else None, root=root)
        elif me:
            c.Scatter(self._b(o.send, dt), inp if o.in_place else recv, root=root)
        else:
            c.Scatter(None, recv, root=root)

    def barrier(self) -> None:
        self.comm.Barrier()

    def allreduce_f64(self, value: float, op: str) -> float:
        MPI = self.MPI
        return float(self.comm.allreduce(float(value),
                                         op={"sum": MPI.SUM, "min": MPI.MIN,
                                             "max": MPI.MAX}[op]))

    def _allgather_u8(self, buf: np.ndarray) -> np.ndarray:
        out = np.empty(self.size * buf.size, dtype=np.uint8)
        self.comm.Allgather([buf, self.MPI.BYTE], [out, self.MPI.BYTE])
        return out
