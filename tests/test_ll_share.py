"""The single-copy all-gather's shared copies (``ll_direct.DirectOp._shared``): pieces
drawn from shared counters (``shm_cma.claim``) are copied exactly once however many
race, ``process_vm_writev`` compiled and through ctypes alike, the same bits on 2-4
ranks (odd sizes, in place and not, every rank's copies counted), a late rank written
into by its peers, a killed peer named, a failed write raised on every rank, and the
unshared paths (``RINGTREE_CMA_SHARE=0``, ``RINGTREE_CMA=0``) giving the same bytes."""

from __future__ import annotations

import errno
import os
import threading
import time

import numpy as np
import pytest
from test_ll_direct import rank_1_dies as direct_rank_1_dies

from ringtree.errors import RingtreeError
from ringtree.ir.program import Collective
from ringtree.runtime.protocols import ll_direct
from ringtree.testing import run_ranks
from ringtree.transports import shm_cma as cma

PIECE = 4096  # small pieces in the tests: many claims per call
ALL_DIRECT = {"RINGTREE_CMA_MIN": "1"}
needs_claim = pytest.mark.skipif(not cma.can_claim(), reason="no compiled _cma")


@needs_claim
@pytest.mark.parametrize("write", [False, True, "bounced"])
def test_racing_claims_copy_every_piece_once(write):
    """Three threads (the GIL released) race on one counter, each copying from its own
    source: every piece of the destination comes whole from one of them, and the pieces
    each reports are the ones that hold its bytes (``bounced``: reads through each
    thread's scratch, smaller than a piece)."""
    bounced, write = write == "bounced", write is True
    piece, npieces = 4096, 3001
    nbytes = piece * npieces - 123  # a short last piece
    srcs = [np.full(nbytes, k + 1, np.uint8) for k in range(3)]
    for _ in range(5):
        dst = np.zeros(nbytes, np.uint8)
        words = np.zeros(4, np.uint64)
        got = [0, 0, 0]

        def run(k: int, dst=dst, words=words, got=got) -> None:
            local, remote = (cma.address(srcs[k]), cma.address(dst)) if write else \
                (cma.address(dst), cma.address(srcs[k]))
            scratch = np.empty(1000, np.uint8) if bounced else None
            got[k] = cma.claim(os.getpid(), words, 2, local, remote, nbytes, piece, write,
                               scratch)
        threads = [threading.Thread(target=run, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        pieces = np.zeros(npieces * piece, np.uint8)
        pieces[:nbytes] = dst
        pieces[nbytes:] = pieces[nbytes - 1]
        rows = pieces.reshape(npieces, piece)
        assert (rows == rows[:, :1]).all(), "a piece copied by two"
        owner = rows[:, 0]
        assert (owner > 0).all(), "a piece copied by none"
        assert [int((owner == k + 1).sum()) for k in range(3)] == got
        assert int(words[2]) >= npieces and not words[[0, 1, 3]].any()


@pytest.mark.parametrize("python", [False, True])
def test_write_spans_into_another_process(python):
    dst = np.zeros(1 << 16, np.uint8)
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # waits for the parent's writes, sends back what it holds
        os.close(r)
        time.sleep(0.5)
        os.write(w, dst.tobytes())
        os._exit(0)
    os.close(w)
    src = np.arange(1 << 16, dtype=np.uint64).astype(np.uint8)
    cuts = [(o, (o * 7) % 991 + 1) for o in range(0, 60000, 997)]
    cma.write_spans(child, [(cma.address(src) + o, cma.address(dst) + o, m) for o, m in cuts],
                    python=python)
    back = b""
    while len(back) < dst.nbytes:
        back += os.read(r, 1 << 16)
    os.close(r)
    os.waitpid(child, 0)
    want = np.zeros_like(dst)
    for o, m in cuts:
        want[o:o + m] = src[o:o + m]
    assert np.frombuffer(back, np.uint8).tobytes() == want.tobytes()
    with pytest.raises(ProcessLookupError):  # reaped
        cma.write_spans(child, [(cma.address(src), cma.address(dst), 8)], python=python)


def shared_in(comm, piece: int) -> None:
    """Share the all-gather's copies in pieces of ``piece`` bytes, with LL's range on 2
    ranks moved below every size (below it the 2-rank single copy pushes instead) and the
    pieces the default on 2 ranks too (else straight reads)."""
    ll_direct.SHARE_PIECE = piece
    ll_direct.MIN_BYTES = {**ll_direct.MIN_BYTES, (Collective.ALL_GATHER, False): 1}
    if comm.ll.direct is not None:
        comm.ll.direct.straight_default = False


def shared_gathers(comm, dtypes: list[str], bounced: bool = False) -> list[str]:
    """All-gathers shared in :data:`PIECE` pieces against Simple's ``direct`` Program;
    what differs, and whether the ranks' pieces add up to every piece exactly once
    (``bounced``: the reads through a scratch smaller than a piece)."""
    shared_in(comm, PIECE)
    if bounced and comm.ll.direct.scratch is not None:
        ll_direct.STREAM_MIN = 1
        comm.ll.direct.scratch = np.empty(1000, np.uint8)
    op_of = {}
    real = ll_direct.DirectOp._shared

    def spy(self, *a):
        op_of["op"] = self
        return real(self, *a)
    ll_direct.DirectOp._shared = spy
    bad, n = [], comm.size
    for dtype in dtypes:
        item = np.dtype(dtype).itemsize
        for count in (PIECE // item + 1, 5 * PIECE // item + 7):
            rng = np.random.default_rng(comm.rank)
            x = rng.integers(0, 100, count).astype(dtype)
            want = comm.all_gather(x, algo="direct").tobytes()
            for in_place in (False, True):
                out = np.zeros(count * n, dtype)
                op_of.clear()
                if in_place:
                    out[comm.rank * count:(comm.rank + 1) * count] = x
                    comm.all_gather(out[comm.rank * count:(comm.rank + 1) * count], out=out)
                else:
                    comm.all_gather(x, out=out)
                if out.tobytes() != want or "op" not in op_of:
                    bad.append(f"{dtype} {count} in_place={in_place}: "
                               f"{'differs' if 'op' in op_of else 'not shared'}")
                    continue
                per = -(-count * item // PIECE)
                pieces = np.array([sum(op_of["op"].pieces)])
                comm.all_reduce(pieces)
                if int(pieces[0]) != n * (n - 1) * per:
                    bad.append(f"{dtype} {count}: {int(pieces[0])} pieces copied, "
                               f"not {n * (n - 1) * per}")
    return bad


@needs_claim
@pytest.mark.parametrize("n,bounced", [(2, False), (3, False), (4, False), (2, True),
                                       (3, True)])
def test_shared_gather_bits_and_pieces(n, bounced):
    res = run_ranks(shared_gathers, n, ["float32", "int8"] if n == 2 else ["float64"],
                    bounced, timeout=60, env=ALL_DIRECT)
    for r, bad in enumerate(res):
        assert bad == [], f"rank {r}: {bad}"


def unshared(comm) -> tuple[bool, bytes]:
    shared_in(comm, PIECE)
    x = np.arange(3 * PIECE + 5, dtype=np.int32) * (comm.rank + 1)
    out = comm.all_gather(x)
    want = np.concatenate([np.arange(x.size, dtype=np.int32) * (r + 1)
                           for r in range(comm.size)])
    return comm.ll.direct is not None and comm.ll.direct.share, out.tobytes() == \
        want.tobytes()


@pytest.mark.parametrize("env", [{"RINGTREE_CMA_SHARE": "0"}, {"RINGTREE_CMA": "0"}])
def test_unshared_paths_give_the_same_bytes(env):
    for shared, same in run_ranks(unshared, 3, timeout=60, env=dict(ALL_DIRECT, **env)):
        assert not shared and same


def rank_1_dies(comm) -> tuple[int | None, str]:
    shared_in(comm, PIECE)
    return direct_rank_1_dies(comm, 4 * PIECE)  # planned on the shared path


@needs_claim
def test_a_killed_peer_is_named():
    res = run_ranks(rank_1_dies, 3, timeout=60, env=ALL_DIRECT)
    for r in (0, 2):
        peer, msg = res[r]
        assert peer in (1, None) and "rank 1 died" in msg, msg
    assert (1, True) in [(res[r][0], res[r][1].startswith("PeerError")) for r in (0, 2)], res


def rank_1_cannot_write(comm) -> tuple[str, bool]:
    shared_in(comm, PIECE)
    x = np.arange(4 * PIECE, dtype=np.float32) + comm.rank
    keep = x.copy()
    if comm.rank == 1:
        real = cma.claim

        def fault(pid, words, index, local, remote, nbytes, piece, write, *scratch):
            if write:
                raise OSError(errno.EFAULT, os.strerror(errno.EFAULT))
            return real(pid, words, index, local, remote, nbytes, piece, write, *scratch)
        ll_direct.cma.claim = fault  # every write fails, whatever is left to claim
    try:
        comm.all_gather(x)
    except RingtreeError as e:
        return str(e), np.array_equal(x, keep)
    return "no error", np.array_equal(x, keep)


@needs_claim
def test_a_failed_write_is_raised_on_every_rank():
    for msg, kept in run_ranks(rank_1_cannot_write, 2, timeout=60, env=ALL_DIRECT):
        assert "rank 1 could not write into rank 0's buffer" in msg and kept, msg


def rank_1_late(comm) -> tuple[tuple[int, int], bool]:
    """Rank 1 starts its reads late: its peers write their inputs into its output."""
    shared_in(comm, PIECE)
    op_of = {}
    real_shared, real_claim = ll_direct.DirectOp._shared, ll_direct.Direct.claim

    def spy(self, *a):
        op_of["op"] = self
        return real_shared(self, *a)

    def late(self, peer, index, local, remote, nbytes, write, *bounce):
        if not write:
            time.sleep(0.3)
        return real_claim(self, peer, index, local, remote, nbytes, write, *bounce)
    ll_direct.DirectOp._shared = spy
    if comm.rank == 1:
        ll_direct.Direct.claim = late
    x = np.arange(16 * PIECE // 8 + 3, dtype=np.float64) * (comm.rank + 1)
    out = comm.all_gather(x)
    want = np.concatenate([np.arange(x.size, dtype=np.float64) * (r + 1)
                           for r in range(comm.size)])
    return op_of["op"].pieces, out.tobytes() == want.tobytes()


@needs_claim
@pytest.mark.parametrize("n", [2, 3])
def test_a_late_rank_is_written_into(n):
    res = run_ranks(rank_1_late, n, timeout=60, env=ALL_DIRECT)
    assert all(same for _, same in res), res
    per = -(-(16 * PIECE // 8 + 3) * 8 // PIECE)
    assert sum(a + b for (a, b), _ in res) == n * (n - 1) * per, res
    assert sum(res[q][0][1] for q in range(n) if q != 1) >= 1, res  # written into rank 1
