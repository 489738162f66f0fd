"""Run functions on N ``torch.distributed`` ranks (ringtree's torch tests and benchmarks).

:class:`TorchRankPool` starts N long-lived processes once. Each initialises
``torch.distributed`` with env:// rendezvous — backend ``"ringtree"`` by default — and,
when asked, a gloo group over the same ranks, so one function can run the same
operation on both and compare. ``pool.run(fn, *args)`` calls ``fn(ctx, *args)`` on every
rank and returns the per-rank results (exceptions come back as values; ``run_ok``
re-raises the first). A run that does not finish in time kills the pool and raises
:class:`~ringtree.testing.HangError` naming the ranks that hung.

Processes come from a ``forkserver`` that has imported torch once, so starting ranks is
cheap and no rank inherits a parent's OpenMP threads. Functions must be importable by
reference (module level), as with multiprocessing.
"""

from __future__ import annotations

import multiprocessing as mp
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ringtree.bootstrap.environ import export
from ringtree.testing import HangError, RankPool, RemoteError, free_port, raise_first, serve

__all__ = ["HangError", "RankContext", "TorchRankPool", "raise_first"]


@dataclass
class RankContext:
    """What a function run by :class:`TorchRankPool` gets on each rank."""

    rank: int
    size: int
    backend: str
    group: Any = None            # the default (WORLD) group
    gloo: Any = None             # a gloo group over the same ranks, if requested
    scratch: dict = field(default_factory=dict)  # kept across runs on this rank


def _context():
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "numpy"])
    return ctx


def _pack(e: BaseException) -> BaseException:
    import pickle

    text = traceback.format_exc()
    try:
        pickle.loads(pickle.dumps(e))
        setattr(e, "__traceback_text__", text)  # noqa: B010 - on any exception type
        return e
    except Exception:  # noqa: BLE001
        return RemoteError(f"{type(e).__name__}: {e}\n{text}")


def _worker(rank: int, size: int, port: int, backend: str, gloo: bool, timeout: float,
            env: dict | None, threads: int, conn) -> None:
    export({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": rank, "WORLD_SIZE": size,
            "LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": size, **(env or {})})
    try:
        import torch
        import torch.distributed as dist

        import ringtree.torch  # noqa: F401 - registers the backend

        torch.set_num_threads(threads)
        ctx = RankContext(rank, size, backend or "")
        if backend:
            dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
            ctx.group = dist.group.WORLD
        if gloo and backend:
            ctx.gloo = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout))
    except BaseException as e:  # noqa: BLE001
        conn.send(("err", _pack(e)))
        return
    serve(conn, ctx, _pack)
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - best effort at exit
        pass


class TorchRankPool(RankPool):
    """N processes with ``torch.distributed`` initialised; ``run`` a function on all.

    ``backend=None`` leaves initialisation to the functions (``MASTER_ADDR``,
    ``MASTER_PORT``, ``RANK`` and ``WORLD_SIZE`` are set for env://).
    """

    def __init__(self, nranks: int, backend: str | None = "ringtree", *, gloo: bool = True,
                 timeout: float = 120.0, pg_timeout: float = 60.0, env: dict | None = None,
                 threads: int = 1):
        port = free_port()
        self._start(_context(), nranks, timeout, _worker,
                    lambda r, child: (r, nranks, port, backend, gloo, pg_timeout, env,
                                      threads, child))
