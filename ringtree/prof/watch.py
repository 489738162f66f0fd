"""Online hang diagnosis through the rendezvous store, and ``monitored_barrier``.

The store stays reachable when the data path is stuck, so it carries the questions and
answers. Keys live under ``<comm prefix>/doctor/``:

- ``gen``: a counter; a rank that times out increments it to ask everyone for a status;
- ``status/<rank>``: rank's latest answer (a JSON :func:`~ringtree.prof.flight.status`
  with the highest ``gen`` it has answered; requests can overlap when several ranks time
  out at once, and an answer to a later request answers the earlier ones too);
  a rank that closes its communicator leaves a last status that answers all requests.

Every process runs one daemon *watcher* thread that looks at ``gen`` of each of its live
communicators every ``RINGTREE_DOCTOR_POLL`` seconds (default 0.5) and answers — so a rank
whose main thread is sleeping, computing or stuck in another call still says where it is
(only a dead or stopped process stays silent, which names it just as well). When asked it
also dumps its flight recorder to the dump directory, so ``ringtree doctor DIR`` can repeat
the analysis offline, and it writes the dump a failing rank leaves for later
(:func:`dump_soon`).

The rank that asks waits up to ``RINGTREE_DOCTOR_WAIT`` seconds (default 2) for the
answers, runs :func:`ringtree.prof.doctor.analyze` and attaches the report to its error;
since it then writes that error as the communicator's abort reason, every other rank's
error carries the culprit too. A dead peer is not asked about: the error already names it
(:func:`ringtree.failure.fail`), and the survivors are told before anything is dumped.
``RINGTREE_DOCTOR=0`` turns the watcher and the gathering off (the report then covers
this rank only).
"""

from __future__ import annotations

import json
import os
import threading
import time
import weakref

from ringtree.errors import CollectiveTimeout
from ringtree.prof import doctor, flight
from ringtree.runtime import at_exit
from ringtree.settings import current


def enabled() -> bool:
    return bool(current().doctor)


def _key(comm, *parts: object) -> str:
    return "/".join([comm.prefix, "doctor", *map(str, parts)])


# ---- answering ----------------------------------------------------------------------------

_answered: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()


class _Watcher:
    """The answering thread. It polls the store from native code (torch's TCPStore under
    torch.distributed), so it is let go at interpreter exit (:mod:`ringtree.runtime.at_exit`):
    ended by finalization inside such a call, it would abort the process."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()
        self.dump_due: tuple[str, list] | None = None  # a dump left for the next poll

    def release_thread(self) -> threading.Thread | None:
        self.stop.set()
        return self.thread


_WATCHER = _Watcher()


def publish(comm, gen: int) -> None:
    """Answer request ``gen`` (and every earlier one) with this rank's status."""
    _answered[comm] = max(gen, _answered.get(comm, 0))
    doc = flight.status(comm)
    doc["gen"] = _answered[comm]
    comm.store.set(_key(comm, "status", comm.rank), json.dumps(doc, default=str))


CLOSED_GEN = 1 << 62


def publish_closed(comm) -> None:
    """The last word of a rank leaving: it answers every later request."""
    try:
        doc = flight.status(comm, closed=True)
        doc["gen"] = CLOSED_GEN
        comm.store.set(_key(comm, "status", comm.rank), json.dumps(doc, default=str))
    except Exception:  # noqa: BLE001 - best effort at shutdown
        pass


def dump_soon(reason: str) -> None:
    """Dump this process's flight recorders off the failure's critical path: at the
    watcher's next poll (or when a communicator closes, or as the watcher stops at exit), so the error is raised and the peers are
    told first; at once where no watcher runs (``RINGTREE_DOCTOR=0``)."""
    w, comms = _WATCHER, list(flight.COMMS)  # as they are now: closed ones leave COMMS
    if w.thread is not None and w.thread.is_alive() and not w.stop.is_set():
        w.dump_due = (reason, comms)
        return
    _dump(reason, comms)


def _dump(reason: str, comms: list) -> None:
    try:
        flight.dump(reason=reason, comms=comms)
    except Exception:  # noqa: BLE001 - a dump must never hide the real error
        pass


def dump_due_now() -> None:
    """Write the dump :func:`dump_soon` left for later, if any (a communicator closes)."""
    _dump_due()


def _dump_due() -> None:
    due, _WATCHER.dump_due = _WATCHER.dump_due, None
    if due is not None:
        _dump(*due)


def _watch_loop() -> None:
    poll = max(0.05, current().doctor_poll)
    while not _WATCHER.stop.wait(poll):
        _dump_due()
        for comm in list(flight.COMMS):
            if getattr(comm, "_closed", False) or _WATCHER.stop.is_set():
                continue
            try:
                raw = comm.store.try_get(_key(comm, "gen"))
            except Exception:  # noqa: BLE001 - store gone or busy: try again later
                continue
            if raw is None or int(raw) <= _answered.get(comm, 0):
                continue
            try:
                publish(comm, int(raw))
                flight.dump(reason=f"asked by a doctor on {comm.prefix}")
            except Exception:  # noqa: BLE001
                pass
    _dump_due()  # asked to stop (exit): a dump still due is written first


def start_watcher() -> None:
    if not enabled():
        return
    with _lock:
        w = _WATCHER
        if not w.stop.is_set() and (w.thread is None or not w.thread.is_alive()):
            w.thread = threading.Thread(target=_watch_loop, name="ringtree-doctor",
                                        daemon=True)
            w.thread.start()
            at_exit.register(w)


# ---- asking -------------------------------------------------------------------------------

def gather(comm, exclude: tuple[int, ...] = (), wait: float | None = None) -> list:
    """Every rank's status (None where no answer came within ``wait`` seconds)."""
    n, me = comm.size, comm.rank
    out: list[dict | None] = [None] * n
    out[me] = flight.status(comm)
    if not enabled() or n == 1:
        return out
    wait = current().doctor_wait if wait is None else wait
    store = comm.store
    gen = store.add(_key(comm, "gen"), 1)
    publish(comm, gen)
    pending = set(range(n)) - {me}
    deadline = time.monotonic() + wait
    while pending:
        for r in list(pending):
            raw = store.try_get(_key(comm, "status", r))
            doc = json.loads(raw) if raw else None
            if doc is not None and doc.get("gen", 0) >= gen:
                pending.discard(r)
                out[r] = doc
        if not pending or time.monotonic() > deadline or pending <= set(exclude):
            break
        time.sleep(0.05)
    return out


def diagnose(comm, exclude: tuple[int, ...] = ()) -> str:
    """Gather, analyse, dump this rank's flight recorder; the report text."""
    try:
        statuses = gather(comm, exclude)
        missing = doctor.ONLINE_MISSING if enabled() else "not asked (RINGTREE_DOCTOR=0)"
        rep = doctor.analyze(statuses, comm.prefix, missing)
        where = ""
        try:
            path = flight.dump(reason="timeout")
            if path:
                d = os.path.dirname(path)
                where = f"\n(flight recorders in {d}; offline: ringtree doctor {d})"
        except Exception:  # noqa: BLE001
            pass
        return rep.text() + where
    except Exception as e:  # noqa: BLE001 - a diagnosis must never hide the real error
        return f"(ringtree doctor could not gather a report: {type(e).__name__}: {e})"


def with_diagnosis(comm, err: BaseException) -> BaseException:
    """A timeout with the doctor's report appended (a dead peer needs none: the error
    names it, see :func:`ringtree.failure.fail`); other errors as they are."""
    if isinstance(err, CollectiveTimeout):
        return CollectiveTimeout(f"{err}\n{diagnose(comm)}")
    return err


# ---- monitored barrier -------------------------------------------------------------------

def monitored_barrier(comm, k: int, timeout: float | None = None,
                      wait_all_ranks: bool = True) -> None:
    """Monitored barrier number ``k`` of ``comm``: a barrier through the store that
    names the ranks that did not arrive.

    Like ``torch.distributed.monitored_barrier``: it does not touch the data path, so it
    works when a peer's connection is broken, and on timeout every rank that arrived raises
    :class:`~ringtree.errors.CollectiveTimeout` listing the missing ranks (all of them,
    or the first one with ``wait_all_ranks=False``) and where each of them is.
    """
    t = comm.timeout if timeout is None else float(timeout)
    store, n = comm.store, comm.size
    base = f"{comm.prefix}/mbarrier"
    keys = [f"{base}/{k}/{r}" for r in range(n)]
    store.set(keys[comm.rank], b"1")
    if k > 2:  # everyone has left barrier k-2 once we are in k
        store.delete(f"{base}/{k - 2}/{comm.rank}")
    deadline = time.monotonic() + t
    delay = 0.001
    while not store.check(keys):
        if time.monotonic() > deadline:
            missing = [r for r in range(n) if not store.check([keys[r]])]
            if not missing:
                break
            shown = missing if wait_all_ranks else missing[:1]
            statuses = gather(comm, wait=min(2.0, max(0.5, t)))
            where = []
            for r in shown:
                s = statuses[r]
                where.append(f"  rank {r}: " + (
                    f"main thread at {s['where']} (last completed seq {s['last_completed']})"
                    if s else "did not answer (dead or stopped?)"))
            names = ", ".join(map(str, shown))
            raise CollectiveTimeout(
                f"rank {comm.rank}: monitored_barrier #{k} timed out after {t:g} s: "
                f"rank{'s' if len(shown) > 1 else ''} {names} did not arrive\n"
                + "\n".join(where))
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
