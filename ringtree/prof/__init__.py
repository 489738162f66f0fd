"""See inside a job: profiler, flight recorder, hang doctor.

- :func:`profile` (or ``RINGTREE_PROFILE=DIR``) records NPKit-style events per rank
  (:mod:`ringtree.prof.recorder`) and writes ``DIR/rank<R>.npz``; ``ringtree trace DIR``
  merges them into one Chrome/Perfetto trace (:mod:`ringtree.prof.trace`).
- Every communicator keeps a flight recorder of its last operations
  (:mod:`ringtree.prof.flight`), dumped on timeout, ``SIGUSR1`` or
  :func:`dump_flight_recorder`.
- On a timeout the doctor (:mod:`ringtree.prof.watch`, :mod:`ringtree.prof.doctor`) asks
  every rank through the store what it is doing and names the culprit;
  ``ringtree doctor DIR`` does it offline. :func:`monitored_barrier` names absent ranks.

The core calls :func:`attach` when a communicator is made and :func:`detach` when it is
closed; nothing here runs on the hot path unless a recorder is attached.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import threading
from contextlib import contextmanager

import numpy as np

from ringtree.prof import flight
from ringtree.prof.recorder import EVENT_DTYPE, PRIMS, Ev, ProfileObserver, Recorder

__all__ = ["Recorder", "dump_flight_recorder", "monitored_barrier", "profile", "start",
           "stop"]

_env_session: list[dict] = []     # RINGTREE_PROFILE: every recorded communicator
_env_lock = threading.Lock()
_atexit_done = False


# ---- core hooks ---------------------------------------------------------------------------

def attach(comm) -> None:
    """Called at the end of communicator creation (collective)."""
    size = comm.settings.fr_buffer_size
    comm.flight = flight.FlightRecorder(size) if size > 0 else None
    flight.COMMS.add(comm)
    flight.install_sigusr1()
    from ringtree.prof import watch

    watch.start_watcher()
    directory = comm.settings.profile
    if directory:
        item = start(comm)
        item["dir"] = directory
        with _env_lock:
            _env_session.append(item)
        _register_atexit()


def detach(comm, flush: bool = True) -> None:
    """Called when a communicator is closed or aborted (never raises). ``flush``: write
    a failure's flight-recorder dump left for later now (the process may be about to
    exit); a recovery that releases the failed parent passes False, so the dump stays
    off its critical path (the watcher writes it)."""
    try:
        from ringtree.prof import watch

        if comm in flight.COMMS:
            watch.publish_closed(comm)
        if flush:
            watch.dump_due_now()
        flight.COMMS.discard(comm)
        if any(it["comm"]() is comm for it in _env_session):
            _write_env_session()
    except Exception:  # noqa: BLE001 - closing must not fail because of the profiler
        pass


# ---- recording ----------------------------------------------------------------------------

def start(comm, capacity: int | None = None) -> dict:
    """Estimate clock offsets (collective) and attach a fresh recorder to ``comm``."""
    import weakref

    from ringtree.prof import clock

    fr, comm.flight = comm.flight, None  # the ping-pong is not the user's traffic
    try:
        sync = clock.estimate(comm)
    finally:
        comm.flight = fr
    rec = Recorder(capacity or comm.settings.profile_events)
    comm.executor.observe(ProfileObserver(rec))
    return {"comm": weakref.ref(comm), "rec": rec, "clock": sync, "meta": _comm_meta(comm)}


def stop(comm) -> Recorder | None:
    """Detach the profiler from ``comm``; its recorder (None if none was attached)."""
    old = comm.executor.observe(None)
    return old.rec if isinstance(old, ProfileObserver) else None


def _comm_meta(comm) -> dict:
    return {"prefix": comm.prefix, "rank": comm.rank, "size": comm.size,
            "world_ranks": list(comm.world_ranks), "world_rank": comm.world_ranks[comm.rank],
            "nchannels": comm.nchannels, "slice_bytes": comm.slice_bytes,
            "host": socket.gethostname(), "host_id": comm.host_id}


def write(directory: str, items: list[dict]) -> str | None:
    """Write ``rank<R>.npz``: one event array per communicator plus JSON metadata."""
    if not items:
        return None
    os.makedirs(directory, exist_ok=True)
    world = min(items, key=lambda it: len(it["meta"]["prefix"]))
    wr = world["meta"]["world_rank"]
    arrays, comms = {}, []
    for k, it in enumerate(items):
        rec: Recorder = it["rec"]
        arrays[f"events{k}"] = rec.events()
        comms.append({**it["meta"], "clock": it["clock"].to_dict(), "calls": rec.calls,
                      "dropped": rec.dropped, "capacity": rec.capacity,
                      "recorded": rec.head, "anchor_ns": list(rec.anchor)})
    meta = {"version": 1, "world_rank": wr, "pid": os.getpid(), "comms": comms,
            "prims": list(PRIMS), "events": {e.name: int(e) for e in Ev},
            "dtype": EVENT_DTYPE.descr}
    arrays["meta"] = np.array(json.dumps(meta))
    path = os.path.join(directory, f"rank{wr}.npz")
    tmp = os.path.join(directory, f".rank{wr}.{os.getpid()}.tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)
    return path


def _write_env_session() -> None:
    with _env_lock:
        items = list(_env_session)
    by_dir: dict[str, list[dict]] = {}
    for it in items:
        by_dir.setdefault(it["dir"], []).append(it)
    for d, its in by_dir.items():
        write(d, its)


def _register_atexit() -> None:
    global _atexit_done
    if not _atexit_done:
        _atexit_done = True
        atexit.register(_write_env_session)


@contextmanager
def profile(directory: str, comm=None, capacity: int | None = None):
    """Record events of ``comm`` (default: every live communicator of this process) and
    write ``directory/rank<R>.npz`` on exit. Collective: enter it on every rank at the same
    point of the program (the clocks are aligned on entry)."""
    comms = [comm] if comm is not None else \
        sorted((c for c in flight.COMMS if not c._closed),
               key=lambda c: (len(c.prefix), c.prefix))  # the same order on every rank
    saved = [c.executor.observer for c in comms]
    items = [start(c, capacity) for c in comms]
    try:
        yield items
    finally:
        for c, old in zip(comms, saved):
            c.executor.observe(old)
        write(directory, items)


def dump_flight_recorder(directory: str | None = None) -> str | None:
    """Write this process's flight recorders (``fr_rank<R>.json``); returns the path."""
    return flight.dump(directory, reason="on demand")


def monitored_barrier(comm, timeout: float | None = None, wait_all_ranks: bool = True) -> None:
    """Barrier through the store naming the ranks that did not arrive (see
    :func:`ringtree.prof.watch.monitored_barrier`)."""
    from ringtree.prof import watch

    watch.monitored_barrier(comm, timeout, wait_all_ranks)
