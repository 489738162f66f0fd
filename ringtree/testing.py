"""Run a function on N ranks as real processes (the harness of ringtree's own tests).

- :func:`run_ranks` starts N fresh processes, calls ``fn(comm, *args)`` on each, and
  returns each rank's result or exception. If the group hangs it is killed and
  :class:`HangError` names the ranks that did not finish.
- :class:`RankPool` keeps N processes (and their communicator) alive across many calls,
  so a test matrix of hundreds of cases pays for process start-up once.

Functions must be importable by reference (module-level), as with multiprocessing.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import secrets
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

from ringtree.bootstrap.environ import export
from ringtree.closing import Closing


class HangError(AssertionError):
    """Ranks that did not finish within the timeout."""

    def __init__(self, ranks: list[int], timeout: float):
        super().__init__(f"rank(s) {ranks} did not finish within {timeout:g} s (killed)")
        self.ranks = ranks


class RemoteError(Exception):
    """An exception raised on a rank that could not be sent back as itself."""


def free_port(span: int = 1) -> int:
    """A loopback port p such that p .. p + span - 1 are all free when this returns.

    ``span`` > 1 is for jobs that bind beside the given port (torchrun's convention
    puts the store on ``MASTER_PORT + 1``); the ports are probed together, so a
    neighbour taken by another program is never handed out.
    """
    if span < 1:
        raise ValueError(f"free_port: span must be >= 1, got {span}")
    for _ in range(100):
        with contextlib.ExitStack() as held:
            first = held.enter_context(socket.socket())
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            try:
                for k in range(1, span):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", port + k))
            except OSError:
                continue
            return port
    raise RuntimeError(f"free_port: no {span} consecutive free loopback ports in 100 tries")


def _ctx():
    return mp.get_context("fork")


def _rank_env(rank: int, n: int, port: int, token: str, extra: dict | None) -> None:
    export({k: None for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK",
                              "PMI_RANK", "SLURM_PROCID", "RINGTREE_STORE_EXTERNAL")})
    export({"RINGTREE_RANK": rank, "RINGTREE_WORLD_SIZE": n, "RINGTREE_LOCAL_RANK": rank,
            "RINGTREE_LOCAL_WORLD_SIZE": n, "RINGTREE_MASTER_ADDR": "127.0.0.1",
            "RINGTREE_MASTER_PORT": port, "RINGTREE_TOKEN": token, **(extra or {})})


def _pack_error(e: BaseException) -> BaseException:
    import pickle

    try:
        pickle.loads(pickle.dumps(e))
        setattr(e, "__traceback_text__", traceback.format_exc())  # noqa: B010 - on any type
        return e
    except Exception:  # noqa: BLE001
        return RemoteError(f"{type(e).__name__}: {e}\n{traceback.format_exc()}")


def _entry(rank: int, n: int, port: int, token: str, env: dict | None, conn,
           fn: Callable | None) -> None:
    _rank_env(rank, n, port, token, env)
    try:
        import ringtree
        from ringtree.settings import current

        s = current()
        comm = ringtree.init(timeout=s.timeout if s.explicit("RINGTREE_TIMEOUT") else 60.0)
    except BaseException as e:  # noqa: BLE001
        conn.send(("err", _pack_error(e)))
        return
    if fn is not None:  # one-shot
        try:
            conn.send(("ok", fn(comm)))
        except BaseException as e:  # noqa: BLE001
            conn.send(("err", _pack_error(e)))
        finally:
            try:
                comm.close()
            except BaseException:  # noqa: BLE001
                pass
        return
    serve(conn, comm)
    try:
        comm.close()
    except BaseException:  # noqa: BLE001
        pass


def serve(conn, target: Any, pack: Callable[[BaseException], BaseException] = _pack_error
          ) -> None:
    """In a rank process: say ready, then answer ``(fn, args, kwargs)`` requests with
    ``fn(target, *args, **kwargs)`` (or the exception) until the parent sends None."""
    conn.send(("ok", "ready"))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        f, args, kwargs = msg
        try:
            conn.send(("ok", f(target, *args, **kwargs)))
        except BaseException as e:  # noqa: BLE001
            conn.send(("err", pack(e)))


def _collect(conns, procs, timeout: float) -> list[Any]:
    deadline = time.monotonic() + timeout
    results: list[Any] = [None] * len(conns)
    pending = set(range(len(conns)))
    while pending:
        for r in list(pending):
            if conns[r].poll(0):
                try:
                    status, value = conns[r].recv()
                except EOFError:
                    status, value = "err", RemoteError(
                        f"rank {r} exited (code {procs[r].exitcode}) without a result")
                results[r] = value if status == "ok" else value
                pending.discard(r)
            elif not procs[r].is_alive() and not conns[r].poll(0.01):
                results[r] = RemoteError(f"rank {r} exited (code {procs[r].exitcode}) "
                                         f"without a result")
                pending.discard(r)
        if not pending:
            break
        if time.monotonic() > deadline:
            for p in procs:
                if p.is_alive():
                    p.kill()
            raise HangError(sorted(pending), timeout)
        mp.connection.wait([conns[r] for r in pending], timeout=0.05)
    return results


def run_ranks(fn: Callable, nranks: int, *args: Any, timeout: float = 60.0,
              env: dict | None = None, **kwargs: Any) -> list[Any]:
    """Run ``fn(comm, *args, **kwargs)`` on ``nranks`` fresh processes; results per rank
    (an exception instance where a rank raised)."""
    import functools

    ctx = _ctx()
    port, token = free_port(), secrets.token_hex(8)
    call = functools.partial(fn, *[], **{}) if not (args or kwargs) else \
        _Bound(fn, args, kwargs)
    conns, procs = [], []
    for r in range(nranks):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_entry, args=(r, nranks, port, token, env, child, call),
                        daemon=True)
        p.start()
        child.close()
        conns.append(parent)
        procs.append(p)
    try:
        return _collect(conns, procs, timeout)
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()


class _Bound:
    def __init__(self, fn: Callable, args: tuple, kwargs: dict):
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def __call__(self, comm):
        return self.fn(comm, *self.args, **self.kwargs)


def raise_first(results: list[Any]) -> list[Any]:
    """Re-raise the first exception among per-rank results (tests' shorthand)."""
    for r, v in enumerate(results):
        if isinstance(v, BaseException):
            raise AssertionError(f"rank {r} raised {type(v).__name__}: {v}\n"
                                 f"{getattr(v, '__traceback_text__', '')}") from v
    return results


class RankPool(Closing):
    """N long-lived ranks with one communicator; ``run`` executes a function on all."""

    def __init__(self, nranks: int, env: dict | None = None, timeout: float = 120.0):
        port, token = free_port(), secrets.token_hex(8)
        self._start(_ctx(), nranks, timeout, _entry,
                    lambda r, child: (r, nranks, port, token, env, child, None))

    def _start(self, ctx, nranks: int, timeout: float, target: Callable,
               args: Callable[[int, Any], tuple]) -> None:
        """Start ``target(*args(rank, pipe))`` per rank and wait until all are ready."""
        self.nranks, self.timeout = nranks, timeout
        self.conns, self.procs = [], []
        for r in range(nranks):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=target, args=args(r, child), daemon=True)
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)
        self.alive = True
        try:
            raise_first(_collect(self.conns, self.procs, timeout))
        except BaseException:
            self.kill()
            raise

    def run(self, fn: Callable, *args: Any, timeout: float | None = None,
            **kwargs: Any) -> list[Any]:
        """``fn(target, *args, **kwargs)`` on every rank; results (or exceptions) per rank."""
        if not self.alive:
            raise RuntimeError("the rank pool is gone (an earlier run hung or it was closed)")
        for c in self.conns:
            c.send((fn, args, kwargs))
        try:
            return _collect(self.conns, self.procs, timeout or self.timeout)
        except HangError:
            self.kill()
            raise

    def run_ok(self, fn: Callable, *args: Any, **kwargs: Any) -> list[Any]:
        return raise_first(self.run(fn, *args, **kwargs))

    def kill(self) -> None:
        self.alive = False
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(timeout=5)

    def close(self) -> None:
        if not self.alive:
            return
        self.alive = False
        for c in self.conns:
            try:
                c.send(None)
            except (OSError, BrokenPipeError):
                pass
        for p in self.procs:
            p.join(timeout=20)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)



def run_msccl_files(comm, paths: list[str], chunks_per_block: int = 2) -> list[str]:
    """Run each MSCCL-IR file (``algo="msccl:PATH"``) on ``comm`` in every mode it
    declares (in place, out of place), with inputs whose sums are exact, and say per
    file ``"exact"`` (every element of this rank's result as it must be, its input
    untouched) or what differs. Each block is ``chunks_per_block`` chunks of the file.
    The protocol used (``Simple``/``LL``) is appended: ``"exact (LL)"``."""
    import numpy as np

    from ringtree import msccl

    verdicts = []
    for path in paths:
        algo, _ = msccl.read(path)
        c = algo.nchunksperloop // max(algo.collective.blocks(comm.size)) * chunks_per_block
        modes = [m for m, ok in ((True, algo.inplace), (False, algo.outofplace or
                                  algo.outofplace is None and not algo.inplace)) if ok]
        bad, protos = [], set()
        for in_place in modes:
            got, want = _run_file(comm, f"msccl:{path}", algo.collective.value, c, in_place)
            protos.add(comm.planner._last.protocol)
            if not np.array_equal(got, want):
                k = int(np.flatnonzero(got != want)[0])
                bad.append(f"{'in place' if in_place else 'out of place'}: element {k} is "
                           f"{got[k]}, not {want[k]}")
        proto = "/".join(sorted("LL" if p == "ll" else "Simple" for p in protos))
        verdicts.append("; ".join(bad) if bad else f"exact ({proto})")
    return verdicts


def _run_file(comm, algo: str, coll: str, c: int, in_place: bool):
    """(result, expected) of one call of ``coll`` with ``c`` elements per block."""
    import numpy as np

    n, r = comm.size, comm.rank

    def x_of(q: int, blocks: int) -> np.ndarray:  # integers below 2^24: exact sums
        return (np.arange(blocks * c, dtype=np.float32) % 251) + 1000 * q

    if coll == "all_reduce":
        x = x_of(r, 1)
        y = x if in_place else np.empty_like(x)
        comm.all_reduce(x, out=y, algo=algo)
        return y, sum(x_of(q, 1) for q in range(n))
    if coll == "all_gather":
        y = np.empty(n * c, np.float32)
        x = y[r * c:(r + 1) * c] if in_place else np.empty(c, np.float32)
        x[...] = x_of(r, 1)
        comm.all_gather(x, out=y, algo=algo)
        return y, np.concatenate([x_of(q, 1) for q in range(n)])
    if coll == "reduce_scatter":
        x = x_of(r, n)
        y = x[r * c:(r + 1) * c] if in_place else np.empty(c, np.float32)
        comm.reduce_scatter(x, out=y, algo=algo)
        return y.copy(), sum(x_of(q, n) for q in range(n))[r * c:(r + 1) * c]
    if coll == "all_to_all":
        x = x_of(r, n) + 100000 * np.repeat(np.arange(n, dtype=np.float32), c)
        y = x if in_place else np.empty_like(x)
        comm.all_to_all(x, out=y, algo=algo)
        want = [x_of(q, n)[r * c:(r + 1) * c] + 100000 * r for q in range(n)]
        return y, np.concatenate(want)
    raise ValueError(f"{algo}: no test inputs for {coll}")
