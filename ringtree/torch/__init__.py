"""ringtree as a ``torch.distributed`` backend.

    import torch.distributed as dist
    import ringtree.torch  # registers backend "ringtree" for CPU tensors

    dist.init_process_group("ringtree")  # under torchrun, ringtree run, mpirun ...
    model = torch.nn.parallel.DistributedDataParallel(model)

Importing this package registers the backend and, under ``mpirun``/``srun`` (which do
not export torch's ``RANK``/``WORLD_SIZE``/``MASTER_*``), fills those in
(:func:`fill_torch_env`). :class:`RingtreeProcessGroup` is the process group torch gets;
:func:`register` registers again (e.g. after torch's backend registry was reset).
"""

from __future__ import annotations

try:
    import torch.distributed as _dist
except ImportError as e:  # pragma: no cover - torch is an optional extra
    raise ImportError("ringtree.torch needs PyTorch: pip install 'ringtree[torch]'") from e

if not _dist.is_available():  # pragma: no cover
    raise ImportError("ringtree.torch needs a PyTorch build with torch.distributed")

from ringtree.torch.backend import BACKEND, RingtreeProcessGroup, create_backend, register
from ringtree.torch.hook import allreduce_hook
from ringtree.torch.launcher_env import fill_torch_env
from ringtree.torch.monitored import install as install_monitored_barrier
from ringtree.torch.shrink import install as install_shrink_group
from ringtree.torch.work import RingtreeWork

register()
install_monitored_barrier()  # dist.monitored_barrier accepts ringtree groups too
install_shrink_group()  # dist.shrink_group too
fill_torch_env()  # mpirun / srun: give env:// its RANK, WORLD_SIZE, MASTER_ADDR/PORT

__all__ = ["BACKEND", "RingtreeProcessGroup", "RingtreeWork", "allreduce_hook", "create_backend",
           "fill_torch_env", "register"]
