"""Per-call cost of blocking ``torch.distributed`` collectives on the ringtree backend,
against the same call on the group's communicator and on a gloo group, alternated round
by round in one process (so a slow phase of the machine hits every column alike).

Run under the launcher (ranks pinned one per core when ranks <= cores)::

    ringtree run -n 2 python benchmarks/torch_percall.py [--iters 2000] [--rounds 5]

Rank 0 prints, per collective and size (the all-reduce also issued with
``async_op=True`` and waited for at once, the general path's cost), the median over rounds of the mean µs per call
for ``dist.*`` on ringtree, the communicator's own NumPy call, ``dist.*`` on gloo, and
``dist.*`` on a Python group whose calls are already done (the floor torch's wrapper sets).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
import torch.distributed as dist

import ringtree.torch  # noqa: F401 - registers the backend


def _per_call(fn, iters: int) -> float:
    dist.barrier()
    t0 = time.perf_counter_ns()
    for _ in range(iters):
        fn()
    return (time.perf_counter_ns() - t0) / iters / 1000.0


class _Done(dist.Work):
    def wait(self, timeout=None) -> bool:
        return True


class _Null(dist.ProcessGroup):
    """A Python process group whose every call is already done: torch's own cost."""

    def __init__(self, rank: int, size: int):
        super().__init__(rank, size)

    def getBackendName(self) -> str:  # noqa: N802 - the trampoline's name
        return "null"

    def _done(self, *args, **kwargs):
        return _Done()

    allreduce = broadcast = reduce = all_gather_single = reduce_scatter_single = _done


def _null_group():
    dist.Backend.register_backend("null", lambda o, b=None: _Null(o.group_rank, o.group_size),
                                  extended_api=True, devices=["cpu"])
    return dist.new_group(backend="null")


def _cases(n: int, nbytes: int, gloo, comm, null) -> dict:
    """(dist on ringtree, the communicator, dist on gloo, dist on a group that does
    nothing: torch's own wrapper) per collective at ``nbytes``."""
    k = max(nbytes // 4, 1)
    t = torch.ones(k)
    x = t.numpy()
    big = torch.ones(k * n)
    bx = big.numpy()
    blk = torch.ones(k)
    kx = blk.numpy()
    return {
        "all_reduce": (lambda: dist.all_reduce(t), lambda: comm.all_reduce(x),
                       lambda: dist.all_reduce(t, group=gloo),
                       lambda: dist.all_reduce(t, group=null)),
        "all_reduce async+wait": (lambda: dist.all_reduce(t, async_op=True).wait(),
                                  lambda: comm.all_reduce(x, async_op=True).wait(),
                                  lambda: dist.all_reduce(t, group=gloo, async_op=True).wait(),
                                  lambda: dist.all_reduce(t, group=null, async_op=True).wait()),
        "all_gather_into_tensor": (lambda: dist.all_gather_into_tensor(big, blk),
                                   lambda: comm.all_gather(kx, out=bx),
                                   lambda: dist.all_gather_into_tensor(big, blk, group=gloo),
                                   lambda: dist.all_gather_into_tensor(big, blk, group=null)),
        "reduce_scatter_tensor": (lambda: dist.reduce_scatter_tensor(blk, big),
                                  lambda: comm.reduce_scatter(bx, out=kx),
                                  None,  # gloo has no reduce_scatter_tensor
                                  lambda: dist.reduce_scatter_tensor(blk, big, group=null)),
        "broadcast": (lambda: dist.broadcast(t, 0), lambda: comm.broadcast(x, 0),
                      lambda: dist.broadcast(t, 0, group=gloo),
                      lambda: dist.broadcast(t, 0, group=null)),
        "reduce": (lambda: dist.reduce(t, 0), lambda: comm.reduce(x, 0),
                   lambda: dist.reduce(t, 0, group=gloo),
                   lambda: dist.reduce(t, 0, group=null)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", default="8,65536", help="bytes, comma-separated")
    ap.add_argument("--profile", default="", help="collective to cProfile on rank 0")
    a = ap.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)
    torch.set_num_threads(1)
    dist.init_process_group("ringtree")
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    comm = dist.group.WORLD.comm
    null = _null_group()
    for nbytes in (int(s) for s in a.sizes.split(",")):
        cases = _cases(n, nbytes, gloo, comm, null)
        for name, fns in cases.items():
            times: list[list[float]] = [[] for _ in fns]
            for fn in fns:  # warm-up: plans the shape
                if fn is not None:
                    _per_call(fn, 20)
            for _ in range(a.rounds):
                for j, fn in enumerate(fns):
                    if fn is not None:
                        times[j].append(_per_call(fn, a.iters))
            if rank == 0:
                cols = [f"{statistics.median(ts):8.2f}" if ts else "       -" for ts in times]
                print(f"{n} ranks {nbytes:>6} B {name:<24} dist {cols[0]}  comm {cols[1]}  "
                      f"gloo {cols[2]}  torch floor {cols[3]}  us/call", flush=True)
            if a.profile == name:
                import cProfile
                import pstats

                pr = cProfile.Profile()
                pr.enable()
                for _ in range(2000):
                    fns[0]()
                pr.disable()
                if rank == 0:
                    pstats.Stats(pr).sort_stats("tottime").print_stats(18)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
