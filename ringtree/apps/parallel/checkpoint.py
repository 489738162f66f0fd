"""Sharded checkpoints: one file per rank, plus ``meta.json``.

Layout of a checkpoint directory::

    meta.json          {"format": "ringtree-train/1", "step": k, "grid": {dp, tp, pp},
                        "model": GPTConfig fields, "spec": training flags}
    rank00000.pt       torch.save({"model": stage/tp-shard state_dict,
    rank00001.pt ...               "optim": optimizer state (ZeRO-1: this rank's block),
                                   "coords": {"dp", "pp", "tp"}, "step": k})

Model keys are those of :class:`ringtree.apps.models.gpt.GPT` (global layer indices), each
rank holding its pipeline stage's keys with tensors split as
:func:`ringtree.apps.parallel.tensor_parallel.shard_dim` says. :func:`load_full_state_dict`
reassembles the plain, unsharded ``state_dict`` (dp rank 0's copy), which any
``GPT(cfg)`` loads; so a checkpoint written on any grid serves any consumer.

Resuming restores the weights, the optimizer state and the step; the data order is a
function of ``(seed, step)``, so the continuation is bit-identical to an uninterrupted
run on the same grid and backend.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from ringtree.apps.models.gpt import GPTConfig
from ringtree.apps.parallel.tensor_parallel import shard_dim

FORMAT = "ringtree-train/1"


def _rank_file(directory: Path, rank: int) -> Path:
    return directory / f"rank{rank:05d}.pt"


def save(directory: str | os.PathLike, trainer, extra: dict | None = None) -> None:
    """Write this rank's shard (every rank calls it; rank 0 also writes ``meta.json``)."""
    d = Path(directory)
    g = trainer.grid
    if g.rank == 0:
        d.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    state = {"model": trainer.model.state_dict(), "optim": trainer.opt.state_dict(),
             "coords": {"dp": g.dp_rank, "pp": g.pp_rank, "tp": g.tp_rank},
             "step": trainer.step}
    tmp = _rank_file(d, g.rank).with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, _rank_file(d, g.rank))
    dist.barrier()
    if g.rank == 0:
        meta = {"format": FORMAT, "step": trainer.step,
                "grid": {"dp": g.dp, "tp": g.tp, "pp": g.pp},
                "model": trainer.cfg.to_dict(), "spec": dict(extra or {})}
        (d / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    dist.barrier()


def read_meta(directory: str | os.PathLike) -> dict:
    """``meta.json`` of a checkpoint, with a clear error if it is not one."""
    path = Path(directory) / "meta.json"
    if not path.is_file():
        raise FileNotFoundError(f"{directory} is not a ringtree checkpoint (no meta.json)")
    meta = json.loads(path.read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    return meta


def resume(directory: str | os.PathLike, trainer) -> int:
    """Load this rank's shard into ``trainer``; returns the step to continue from."""
    meta = read_meta(directory)
    g = trainer.grid
    want = {"dp": g.dp, "tp": g.tp, "pp": g.pp}
    if meta["grid"] != want:
        raise ValueError(f"checkpoint {directory} was written on grid {meta['grid']}, "
                         f"this run is {want}; resume on the same grid")
    if GPTConfig.from_dict(meta["model"]) != trainer.cfg:
        raise ValueError(f"checkpoint {directory} holds model {meta['model']}, "
                         f"this run builds {trainer.cfg.to_dict()}")
    state = torch.load(_rank_file(Path(directory), g.rank), weights_only=True)
    trainer.model.load_state_dict(state["model"])
    trainer.opt.load_state_dict(state["optim"])
    trainer.step = int(state["step"])
    return trainer.step


def load_full_state_dict(directory: str | os.PathLike) -> tuple[GPTConfig, dict]:
    """The unsharded model of a checkpoint: ``(config, state_dict)`` for ``GPT(config)``."""
    meta = read_meta(directory)
    grid = meta["grid"]
    dp, tp, pp = grid["dp"], grid["tp"], grid["pp"]
    ranks = torch.arange(dp * tp * pp).view(dp, pp, tp)
    full: dict[str, torch.Tensor] = {}
    for s in range(pp):
        shards = [torch.load(_rank_file(Path(directory), int(ranks[0, s, t])),
                             weights_only=True)["model"] for t in range(tp)]
        for key in shards[0]:
            dim = shard_dim(key)
            full[key] = shards[0][key] if dim is None or tp == 1 else \
                torch.cat([sh[key] for sh in shards], dim=dim)
    return GPTConfig.from_dict(meta["model"]), full
