"""Agreement (ULFM's ``MPIX_Comm_agree``): one value and one failed set on every survivor.

Each rank posts ``flag`` under ``<prefix>/ft/a<n>/v/<rank>`` in the store (``n``: the
communicator's agreement count, the same on every rank, since agree is collective), then
looks at the others: a rank has *contributed* once its post is there, and has *failed*
once its process is gone (:func:`~ringtree.resilience.state.is_dead`) or, for ranks whose
process this host cannot see, once the agreement's deadline has passed without its post.
When every rank has contributed or failed, the rank writes its decision — the bitwise
AND of the contributions and the sorted failed set — with compare-and-set under
``.../d``; the first decision written stands and every rank returns *that one*, even
one that had seen more or fewer failures. So the result is uniform however ranks die
during the agreement (a rank that posted and then died counts as a contributor; its
death is decided by the next agreement), which is the property the ULFM man page
specifies; the store's compare-and-set is the consensus (a central coordinator, as
torchft's Lighthouse, rather than ULFM's early-returning agreement tree, Herault et al.,
SC15). A rank declared failed that is in fact alive (stopped, partitioned) reads its own
rank in the decision and raises :class:`~ringtree.errors.RecoveryError`; it never joins
the survivors' view.

Waiting polls the store with growing pauses (2 ms up to 20 ms): no core is burnt.
"""

from __future__ import annotations

import time

from ringtree.errors import RecoveryError
from ringtree.resilience.state import is_dead, state


def _encode(value: int, failed: list[int]) -> bytes:
    return f"{value}|{','.join(map(str, failed))}".encode()


def _decode(raw: bytes) -> tuple[int, list[int]]:
    value, _, failed = raw.decode().partition("|")
    return int(value), [int(r) for r in failed.split(",") if r]


def _store(comm, what: str, fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - the store itself failed: nothing to agree with
        host = comm.store_host_rank
        where = f" (it ran in rank {host}'s process)" if host is not None else ""
        raise RecoveryError(f"rank {comm.rank}: agree: the store is unreachable{where}, so "
                            f"the survivors cannot agree ({what}: {e})") from None


def agree(comm, flag: int = 1, *, timeout: float | None = None) -> int:
    """The AND of ``flag`` over the ranks that contribute; afterwards
    :func:`failed_ranks` is the same on every survivor. Collective over the survivors;
    works on a revoked communicator. ``timeout`` (default: the communicator's) bounds
    the wait for a rank whose death this host cannot see."""
    st = state(comm)
    st.agreements += 1
    base = f"{comm.prefix}/ft/a{st.agreements}"
    store = comm.store
    _store(comm, "post", store.set, f"{base}/v/{comm.rank}", _encode(int(flag), []))
    deadline = time.monotonic() + (comm.timeout if timeout is None else timeout)
    got: dict[int, int] = {}
    dead = set(st.failed)
    pause = 0.002
    raw = None
    while raw is None:
        raw = _store(comm, "read", store.try_get, f"{base}/d")
        if raw is not None:
            break
        late = time.monotonic() > deadline
        for r in range(comm.size):
            if r in got or r in dead:
                continue
            v = _store(comm, "read", store.try_get, f"{base}/v/{r}")
            if v is not None:
                got[r] = _decode(v)[0]
            elif late or is_dead(comm, r):
                dead.add(r)
        if len(got) + len(dead) == comm.size:
            value = -1
            for r in sorted(got):
                value &= got[r]
            mine = _encode(value, sorted(dead))
            raw = _store(comm, "decide", store.compare_set, f"{base}/d", None, mine)
            break
        time.sleep(pause)
        pause = min(pause * 1.5, 0.02)
    value, failed = _decode(raw)
    if comm.rank in failed:
        raise RecoveryError(f"rank {comm.rank}: the other ranks declared this rank failed "
                            f"(it did not take part in agreement {st.agreements} in time); "
                            f"it is no longer a member")
    st.failed.extend(r for r in failed if r not in st.failed)
    return value


def failed_ranks(comm) -> list[int]:
    """Ranks known failed here (ULFM's ``MPIX_Comm_get_failed``): the agreed ones in
    decision order, then any other rank of this host whose process is gone. After
    :func:`agree` returns, its agreed part is the same on every survivor."""
    st = state(comm)
    seen = [r for r in range(comm.size) if r not in st.failed and r != comm.rank
            and is_dead(comm, r)]
    return list(st.failed) + seen


def ack_failed(comm, count: int | None = None) -> int:
    """Acknowledge the first ``count`` failed ranks (all known ones when None), as
    ULFM's ``MPIX_Comm_ack_failed``; returns how many are acknowledged. ``0`` reads the
    count without changing it."""
    known = failed_ranks(comm)
    st = state(comm)
    if count is None:
        count = len(known)
    if count < 0:
        raise ValueError(f"ack_failed: count must be >= 0, got {count}")
    st.acked = max(st.acked, min(count, len(known)))
    return st.acked
