"""The process grid: ``grid = arange(world).view(dp, pp, tp)`` (picotron's layout).

tp is the fastest-varying axis, so tensor-parallel peers are neighbouring ranks (one host,
shared memory, as Megatron keeps TP inside an NVLink domain), then pipeline stages, then
data-parallel replicas. The dp, pp and tp groups are made once with ``new_group``: every
rank calls ``new_group`` for every group of each axis in the same order, as torch
requires, and keeps the ones it belongs to.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


class GridError(ValueError):
    """Grid arguments that cannot work (raised before any communication)."""


def check_grid(world: int, dp: int, tp: int, pp: int, n_head: int, n_layer: int,
               batch_size: int | None = None, micro_batches: int = 1,
               vocab_size: int | None = None) -> None:
    """Refuse a grid that cannot run this model, naming the argument at fault."""
    for name, v in (("dp", dp), ("tp", tp), ("pp", pp), ("micro-batches", micro_batches)):
        if v < 1:
            raise GridError(f"--{name} must be at least 1, got {v}")
    if dp * tp * pp != world:
        raise GridError(f"world size {world} is not dp*tp*pp = {dp}*{tp}*{pp} = {dp * tp * pp}")
    if n_head % tp:
        raise GridError(f"--tp {tp} does not divide the number of attention heads {n_head}")
    if vocab_size is not None and vocab_size % tp:
        raise GridError(f"--tp {tp} does not divide the vocabulary size {vocab_size}")
    if pp > n_layer:
        raise GridError(f"--pp {pp} is larger than the number of layers {n_layer}")
    if batch_size is not None and batch_size % (dp * micro_batches):
        raise GridError(f"--batch-size {batch_size} is not divisible by "
                        f"dp*micro-batches = {dp}*{micro_batches}")


@dataclass
class Grid:
    """One rank's place on the (dp, pp, tp) grid, its groups and pipeline neighbours."""

    rank: int
    dp: int
    pp: int
    tp: int
    dp_rank: int
    pp_rank: int
    tp_rank: int
    dp_group: object
    pp_group: object
    tp_group: object
    pp_ranks: list[int]       # global ranks of this rank's pipeline, stage order
    dp_ranks: list[int]
    tp_ranks: list[int]

    @property
    def world(self) -> int:
        return self.dp * self.pp * self.tp

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1

    @property
    def next_rank(self) -> int | None:
        """Global rank of the next pipeline stage (None on the last)."""
        return None if self.last_stage else self.pp_ranks[self.pp_rank + 1]

    @property
    def prev_rank(self) -> int | None:
        return None if self.first_stage else self.pp_ranks[self.pp_rank - 1]

    def axis_of(self, group: object) -> str:
        """``"dp"``, ``"pp"`` or ``"tp"`` for one of this rank's groups."""
        for name in ("tp", "pp", "dp"):
            if group is getattr(self, f"{name}_group"):
                return name
        return "world"


def build_grid(dp: int, tp: int, pp: int, backend: str | None = None) -> Grid:
    """Make the grid's groups from the initialised default group (collective call)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if dp * tp * pp != world:
        raise GridError(f"world size {world} is not dp*tp*pp = {dp}*{tp}*{pp} = {dp * tp * pp}")
    grid = torch.arange(world).view(dp, pp, tp)
    d, p, t = (int(v) for v in (grid == rank).nonzero()[0])
    axes = {
        "tp": [grid[i, j, :].tolist() for i in range(dp) for j in range(pp)],
        "pp": [grid[i, :, k].tolist() for i in range(dp) for k in range(tp)],
        "dp": [grid[:, j, k].tolist() for j in range(pp) for k in range(tp)],
    }
    groups: dict[str, object] = {}
    members: dict[str, list[int]] = {}
    for name, lists in axes.items():
        for ranks in lists:
            g = dist.new_group(ranks, backend=backend) if len(ranks) > 1 else None
            if rank in ranks:
                groups[name], members[name] = g, ranks
    return Grid(rank, dp, pp, tp, d, p, t, groups["dp"], groups["pp"], groups["tp"],
                members["pp"], members["dp"], members["tp"])
