"""Failure propagation: the first rank that sees an error records it for every rank.

A rank that hits an error (a peer that died, a mismatch, a timeout) writes one line to the
store under ``<prefix>/abort`` (compare-and-set: the first writer wins) before closing its
sockets. Every other rank notices — through EOF on its sockets, or by looking at the store
once a second while it waits (:func:`check_abort`) — and raises an error that carries that
line, so each rank's message names the rank that started the failure. The communicator
(:class:`ringtree.Communicator`) owns its :class:`Health`; these functions are the policy,
and the only writers of it.
"""

from __future__ import annotations

import time

from ringtree.bootstrap.store import StoreTimeout
from ringtree.errors import CollectiveTimeout, CommAborted, CommRevoked, MismatchError, PeerError


class Health:
    """A communicator's failure state, read by anyone (the doctor's status, the issue
    path), written only by the functions of this module.

    ``broken``: the error every later call raises (None while healthy);
    ``after_abort``: the first cause, when this rank failed because another rank did;
    ``failing``: this rank is reporting a failure (the doctor: not stuck)."""

    __slots__ = ("broken", "after_abort", "failing")

    def __init__(self) -> None:
        self.broken: BaseException | None = None
        self.after_abort: str | None = None
        self.failing = False


def _break(comm, err: BaseException) -> None:
    """Every later call on ``comm`` raises ``err``; its hot entries ask first (the
    communicator's ``_hot_blocked``), so they are told after the state is set."""
    comm.health.broken = err
    comm._hot_off = True


def abort_key(comm) -> str:
    return f"{comm.prefix}/abort"


def check_abort(comm) -> None:
    """Called while waiting: raise if another rank has aborted the communicator."""
    try:
        why = comm.store.try_get(abort_key(comm))
    except Exception:  # noqa: BLE001 - the store itself may be gone
        return
    if why:
        kind = comm.store.try_get(abort_key(comm) + "_kind")
        raise (MismatchError if kind == b"mismatch" else CommRevoked if kind == b"revoked"
               else CommAborted)(why.decode())
    from ringtree.runtime.fingerprint import check_stalled

    check_stalled(comm)


def abort_kind(comm) -> bytes | None:
    try:
        return comm.store.try_get(abort_key(comm) + "_kind")
    except Exception:  # noqa: BLE001 - the store may be gone
        return None


def on_error(comm, e: BaseException) -> BaseException:
    """A call failed: a communication failure (a dead peer or switch, a mismatch, a
    timeout, an abort) is recorded for every rank (:func:`fail`); anything else is the
    caller's own error and returned as it is."""
    from ringtree.switch.wire import SwitchError

    if isinstance(e, (PeerError, MismatchError, CollectiveTimeout, CommAborted,
                      SwitchError)):  # a dead switch is a dead peer for everyone
        return fail(comm, e)
    return e


def fail(comm, e: BaseException) -> BaseException:
    """Record the failure for everyone, close the sockets, and say who started it.

    The first cause wins: a rank that fails because of another rank's failure (an
    abort line in the store, or a peer that closed and left its reason in shared
    memory) names that cause, never the peer that merely closed on its way out."""
    comm.health.failing = True  # the doctor: this rank is reporting, not stuck
    if isinstance(e, CommAborted):
        cls = CommRevoked if isinstance(e, CommRevoked) else CommAborted
        err: BaseException = cls(f"rank {comm.rank}: communicator aborted by another rank: {e}")
        return broken_by(comm, err, str(e))
    reason = str(e)
    if isinstance(e, PeerError):
        store_ok = True
        try:  # a rank that fails writes why before it closes its sockets
            theirs = comm.store.try_get(abort_key(comm))
        except Exception:  # noqa: BLE001 - the store may have died with rank 0
            theirs, store_ok = None, False
        first = theirs.decode() if theirs else getattr(e, "cause", None)
        if first and abort_kind(comm) == b"mismatch":  # the cause, and its type
            err = MismatchError(f"rank {comm.rank}: {first}")
            _break(comm, err)
            comm.fabric.close(first)
            return err
        if first:
            cls = CommRevoked if abort_kind(comm) == b"revoked" else CommAborted
            err = cls(f"rank {comm.rank}: lost the connection to rank {e.peer}; "
                      f"the communicator was aborted because {first}")
            err.peer = e.peer
            record_abort(comm, first)
            return broken_by(comm, err, first)
        host = comm.store_host_rank
        if not store_ok and host is not None and host != e.peer and host != comm.rank:
            reason = (f"rank {host}, which hosts the store, is gone (its store at "
                      f"{comm.store!r} is unreachable); seen by rank {comm.rank} as: {e}")
            err = PeerError(host, reason)
            _break(comm, err)
            comm.fabric.close(reason)
            return err
        reason = (f"rank {e.peer} died or closed its connection (seen by rank "
                  f"{comm.rank}): {e}\nculprit: rank {e.peer} — {_how(e)}; nobody else is "
                  f"asked (the error names it)")
        return _tell_then_dump(comm, PeerError(e.peer, reason), reason, e)
    err = e
    if isinstance(err, CollectiveTimeout):  # a partition? say whom we cannot reach
        from ringtree.bootstrap.netcheck import unreachable_note
        from ringtree.prof.watch import with_diagnosis

        note = unreachable_note([(p.rank, p.host, p.port) for p in comm.peers
                                 if p.host_id != comm.host_id])
        err = CollectiveTimeout(f"{err}{note}") if note else err
        err = with_diagnosis(comm, err)  # ask every rank; name the culprit
        reason = str(err)
    return _record(comm, err, reason, e)


def _how(e: PeerError) -> str:
    text = str(e)
    return "its process is gone" if " died" in text or "is gone" in text else \
        "it closed its connection"


def _tell_then_dump(comm, err: BaseException, reason: str, e: BaseException) -> BaseException:
    """A dead peer: the culprit is known, so the survivors are told at once (abort line,
    hang-up; the dead ranks this rank knows of added to their key, :func:`gone`) and this
    rank's flight recorder is dumped afterwards, off the critical path
    (:func:`ringtree.prof.watch.dump_soon`). Asking every rank for the hang doctor's
    report and dumping first took 0.1–0.3 s at 8 ranks on 2 cores."""
    _add_gone(comm, {e.peer} | comm.fabric.dead_peers())
    err = _record(comm, err, reason, e)
    from ringtree.prof.watch import dump_soon

    dump_soon(f"rank {getattr(e, 'peer', '?')} failed")
    return err


def _record(comm, err: BaseException, reason: str, e: BaseException) -> BaseException:
    """Write the abort line (the first cause wins), close the links; the error to raise."""
    won = record_abort(comm, reason)
    if won == reason and isinstance(err, MismatchError):
        try:
            comm.store.compare_set(abort_key(comm) + "_kind", None, b"mismatch")
        except Exception:  # noqa: BLE001
            pass
    if won is not None and won != reason and isinstance(err, (CollectiveTimeout,
                                                              PeerError)):
        err = CommAborted(f"rank {comm.rank}: the communicator was aborted because "
                          f"{won}\n(this rank then saw: {str(e).splitlines()[0]})")
        return broken_by(comm, err, won)
    _break(comm, err)
    comm.fabric.close(reason)
    return err


def gone(comm) -> set[int]:
    """The ranks a broken communicator knows are dead, none while it is healthy: the peer
    its own error names (a :class:`PeerError` with no cause), and every rank any rank
    recorded dead (:func:`_tell_then_dump`: the peer its error named, and those its
    transports saw gone then). These will never close (:func:`await_closes`)."""
    err = comm.health.broken
    if err is None:
        return set()
    out = {err.peer} if isinstance(err, PeerError) and err.cause is None else set()
    try:
        out |= _ranks(comm.store.try_get(abort_key(comm) + "_gone"))
    except Exception:  # noqa: BLE001 - the store may be gone
        pass
    out.discard(comm.rank)
    return out


def _ranks(raw: bytes | None) -> set[int]:
    return {int(r) for r in raw.split(b",")} if raw else set()


def _add_gone(comm, ranks: set[int]) -> None:
    """Add ``ranks`` to the set of dead ranks in the store: compare-and-set of the
    sorted list, retried from the value that stood (each retry means another rank added
    some, so at most one a rank)."""
    key = abort_key(comm) + "_gone"
    try:
        raw = comm.store.try_get(key)
        for _ in range(comm.size + 1):
            want = ranks | _ranks(raw)
            new = ",".join(map(str, sorted(want))).encode()
            if new == raw:
                return
            won = comm.store.compare_set(key, raw, new)
            if won == new:
                return
            raw = won
    except Exception:  # noqa: BLE001 - the store may be gone
        pass


def closed_key(comm, rank: int) -> str:
    """Set by ``rank`` as it closes (its store client's last word)."""
    return f"{comm.prefix}/closed/{rank}"


def await_closes(comm, timeout: float) -> tuple[set[int], set[int]]:
    """The store's host, closing: wait until every other rank has closed or is known to
    be dead, for at most ``timeout`` s, so the store outlives every rank that may still
    use it and no longer. Dead: :func:`gone`, and the peers its transports see gone
    (shared memory: pid and start time), looked at every 0.1 s. A rank that closed and
    exited counts as closed: the keys are read first. Returns (closed, dead); a rank in
    neither was still running at the timeout."""
    store, deadline = comm.store, time.monotonic() + timeout
    waiting = set(range(comm.size)) - {comm.rank}
    closed: set[int] = set()
    dead: set[int] = set()
    while True:
        closed |= {r for r in waiting if store.check([closed_key(comm, r)])}
        dead |= (gone(comm) | comm.fabric.dead_peers()) & (waiting - closed)
        waiting -= closed | dead
        left = deadline - time.monotonic()
        if not waiting or left <= 0:
            return closed, dead
        try:
            store.wait([closed_key(comm, r) for r in sorted(waiting)], min(0.1, left))
            return closed | waiting, dead
        except StoreTimeout:
            pass


def record_abort(comm, reason: str) -> str | None:
    """Write the abort line unless one exists; the line that stands (None: no store)."""
    try:
        return comm.store.compare_set(abort_key(comm), None, reason.encode()).decode()
    except Exception:  # noqa: BLE001 - the store may be gone
        return None


def broken_by(comm, err: BaseException, cause: str) -> BaseException:
    """Fail because of another rank's failure ``cause``: leave our state for the
    doctor ("exited after the abort", not "stuck"), pass the cause on as we close."""
    _break(comm, err)
    comm.health.after_abort = cause
    from ringtree.prof.watch import publish_closed

    publish_closed(comm)
    comm.fabric.close(cause)
    return err


def aborted_here(comm, why: str) -> BaseException:
    """This rank aborts (``comm.abort()``): record it for every rank; the error its own
    calls in flight and later raise."""
    record_abort(comm, why)
    health = comm.health
    _break(comm, health.broken or CommAborted(f"rank {comm.rank} aborted"))
    return health.broken


def revoked_here(comm, why: str) -> BaseException:
    """This rank revokes the communicator (``comm.revoke()``): the store says so for
    every rank (the kind first, so a rank that reads the line reads the kind), and every
    later call here raises :class:`~ringtree.errors.CommRevoked`."""
    try:
        comm.store.set(abort_key(comm) + "_kind", b"revoked")
    except Exception:  # noqa: BLE001 - the store may be gone; the hang-up still works
        pass
    record_abort(comm, why)
    health = comm.health
    if not isinstance(health.broken, CommRevoked):
        _break(comm, CommRevoked(f"rank {comm.rank}: the communicator was revoked: {why}"))
    return health.broken
